"""The tree-sitter grammars the chunker knows, and what a definition is in each.

Grammars come from the per-language wheels (`common.grammars` loads each once, on first use).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from tree_sitter import Node, Parser

from common import grammars
from common import languages as common_languages


@dataclass(frozen=True)
class Grammar:
    """One language: definition node types (→ symbol kind) and containers; its wheel is in
    `common.grammars`."""

    name: str
    definitions: dict[str, str]
    # Nodes whose children may hold further definitions (class bodies, impl blocks, …).
    containers: frozenset[str]


_C_DEFS = {
    "function_definition": "function",
    "struct_specifier": "struct",
    "enum_specifier": "enum",
    "union_specifier": "struct",
    "type_definition": "type",
}
_JS_DEFS = {
    "function_declaration": "function",
    "generator_function_declaration": "function",
    "class_declaration": "class",
    "method_definition": "method",
    "lexical_declaration": "variable",
    "export_statement": "export",
}
_TS_DEFS = {
    **_JS_DEFS,
    "abstract_class_declaration": "class",
    "interface_declaration": "interface",
    "type_alias_declaration": "type",
    "enum_declaration": "enum",
    "internal_module": "module",
    "function_signature": "function",
}
_JS_CONTAINERS = frozenset({"class_body", "export_statement", "statement_block"})

GRAMMARS: dict[str, Grammar] = {
    g.name: g
    for g in (
        Grammar(
            "python",
            {
                "function_definition": "function",
                "class_definition": "class",
                "decorated_definition": "decorated",
            },
            frozenset({"block", "decorated_definition"}),
        ),
        Grammar("javascript", _JS_DEFS, _JS_CONTAINERS),
        Grammar("typescript", _TS_DEFS, _JS_CONTAINERS),
        Grammar("tsx", _TS_DEFS, _JS_CONTAINERS),
        Grammar(
            "go",
            {
                "function_declaration": "function",
                "method_declaration": "method",
                "type_declaration": "type",
            },
            frozenset(),
        ),
        Grammar(
            "rust",
            {
                "function_item": "function",
                "struct_item": "struct",
                "enum_item": "enum",
                "trait_item": "interface",
                "impl_item": "impl",
                "mod_item": "module",
                "macro_definition": "macro",
                "type_item": "type",
            },
            frozenset({"declaration_list"}),
        ),
        Grammar(
            "java",
            {
                "class_declaration": "class",
                "interface_declaration": "interface",
                "enum_declaration": "enum",
                "record_declaration": "class",
                "method_declaration": "method",
                "constructor_declaration": "constructor",
            },
            frozenset({"class_body", "interface_body", "enum_body", "enum_body_declarations"}),
        ),
        Grammar("c", _C_DEFS, frozenset()),
        Grammar(
            "cpp",
            {
                **_C_DEFS,
                "class_specifier": "class",
                "namespace_definition": "namespace",
                "template_declaration": "template",
            },
            frozenset({"field_declaration_list", "declaration_list", "template_declaration"}),
        ),
    )
}

# Extension (with the dot) -> grammar name, from the one language table.
EXTENSIONS: dict[str, str] = {
    f".{extension}": language.grammar
    for language in common_languages.LANGUAGES
    if language.grammar is not None
    for extension in language.extensions
}


def language_of(path: str) -> str:
    """The chunker's name for a path's language: a grammar name, else the extension (or `text`).

    Not a request's language, which is an LSP id (`common.languages.request_language`)."""
    suffix = PurePosixPath(path).suffix.lower()
    return EXTENSIONS.get(suffix, suffix[1:] or "text")


def parser_for(language: str) -> Parser | None:
    """A new parser for `language`, or None when no grammar is bundled for it."""
    if language not in GRAMMARS:
        return None
    return grammars.parser_for(language)


_NAME_NODES = frozenset(
    {
        "identifier",
        "field_identifier",
        "type_identifier",
        "qualified_identifier",
        "operator_name",
        "destructor_name",
        "property_identifier",
        "namespace_identifier",
    }
)


def definition_name(node: Node) -> str | None:
    """The name a definition node introduces, or None (anonymous, or not a definition)."""
    kind = node.type
    if kind in ("decorated_definition", "export_statement", "template_declaration"):
        inner = node.child_by_field_name("definition") or node.child_by_field_name("declaration")
        if inner is None:
            inner = next((c for c in reversed(node.named_children) if c.type != "comment"), None)
        return definition_name(inner) if inner is not None and inner is not node else None
    if kind == "impl_item":
        target = node.child_by_field_name("type")
        trait = node.child_by_field_name("trait")
        if target is None:
            return None
        return f"{_text(trait)} for {_text(target)}" if trait is not None else _text(target)
    if kind == "type_declaration":
        spec = next((c for c in node.named_children if c.type in ("type_spec", "type_alias")), None)
        return definition_name(spec) if spec is not None else None
    if kind == "lexical_declaration":
        declarator = next((c for c in node.named_children if c.type == "variable_declarator"), None)
        value = declarator.child_by_field_name("value") if declarator is not None else None
        if declarator is None or value is None or value.type not in _FUNCTION_VALUES:
            return None
        return definition_name(declarator)
    name = node.child_by_field_name("name")
    if name is not None:
        return _text(name)
    declarator = node.child_by_field_name("declarator")
    while declarator is not None:
        if declarator.type in _NAME_NODES:
            return _text(declarator)
        declarator = declarator.child_by_field_name("declarator")
    return None


_FUNCTION_VALUES = frozenset(
    {"arrow_function", "function_expression", "function", "class", "generator_function"}
)


def definition_kind(grammar: Grammar, node: Node) -> str:
    """The symbol kind of a definition node (wrappers report what they wrap)."""
    kind = grammar.definitions[node.type]
    if kind in ("decorated", "export", "template"):
        inner = node.child_by_field_name("definition") or node.child_by_field_name("declaration")
        if inner is not None and inner.type in grammar.definitions:
            return definition_kind(grammar, inner)
        return "function" if kind == "decorated" else "variable"
    if kind == "variable":
        return "function"  # only function-valued declarations are definitions
    return kind


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", errors="replace")
