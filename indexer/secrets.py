"""What counts as a secret: file names on the deny list, and credentials found in a file's content.

Names are matched case-insensitively (`.ENV`, `ID_RSA` and `Server.PEM` are the same secrets on a
case-insensitive file system, and a renamed copy is no safer). Directory patterns (`.ssh`) are
matched against every component of a path relative to the workspace root, so a denied directory
denies all it holds; file patterns (`credentials`, `shadow`) only against a file's own name, so
source directories such as `djangoapps/credentials/` or `src/shadow/` are indexed. A few files are
secrets only in their place (`.docker/config.json`). The list follows what gitleaks,
detect-secrets and editor assistants' security ignore lists cover.

Content is checked for markers whose false-positive rate is near zero: PEM and OpenSSH private
key blocks (also indented, as in YAML, or with escaped line breaks, as in JSON and string
literals) and token formats with a fixed prefix and length (AWS, GitHub, GitLab, Slack, Google,
Stripe, npm, PyPI, OpenAI, Anthropic). A file that merely mentions "password" is not a secret.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re

from common.languages import LANGUAGES

DENY_DIRS = (
    ".ssh",
    ".gnupg",
    ".aws",
    # Terraform's working directory (backend state, provider credentials) and workspace states.
    ".terraform",
    "terraform.tfstate.d",
)
"""Name patterns (shell globs, lower case) of directories never entered: whatever they hold is a
secret. Matched against every component of a path."""

DENY_PATTERNS = (
    # Environment files, and their copies (`prod.env`, `.env.local`, `secrets.env.bak`).
    ".env*",
    "*.env",
    "*.env.*",
    ".envrc",
    # Private keys and key stores, with backup or copy suffixes (`key.pem.txt`).
    "*.pem",
    "*.pem.*",
    "*.key",
    "*.key.*",
    "*.p8",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.bks",
    "*.keystore",
    "*.ppk",
    "*.kdbx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*_rsa",
    "*_dsa",
    "*_ecdsa",
    "*_ed25519",
    "ssh_host_*_key*",
    "secring.*",
    # Credentials of tools and clouds.
    "credentials",
    "*_credentials",
    "*-credentials",
    "service-account*.json",
    "legacy_credentials",
    "access_tokens.db",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".my.cnf",
    ".pypirc",
    ".npmrc",
    ".git-credentials",
    ".gitcookies",
    ".dockercfg",
    "kubeconfig",
    "*.kubeconfig",
    ".s3cfg",
    ".boto",
    ".vault-token",
    ".terraformrc",
    "terraform.rc",
    "*.tfvars",
    "*.tfvars.json",
    "*.tfstate",
    "*.tfstate.*",
    ".htpasswd",
    "*.htpasswd",
    # Account databases of Unix systems (a copy of /etc in a workspace).
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "passwd",
    "passwd-",
    "master.passwd",
)
"""Name patterns (shell globs, lower case) of files never indexed, whatever the ignore files say.
Matched against a file's own name only: a directory `credentials/` or `shadow/` holds code."""

SOURCE_EXEMPT_PATTERNS = ("*.env.*", "*.key.*")
"""Patterns of copies (`secrets.env.bak`, `tls.key.old`) that also name source files
(`vite.env.d.ts`, `api.key.test.ts`): a name with a code extension is not denied by them (its
content is still checked)."""

# Languages whose files hold data or settings rather than code: `prod.env.yaml`, `deploy.env.sh`
# or `tls.key.xml` are copies of secrets, so they stay denied.
_DATA_LANGUAGES = frozenset(
    {
        "yaml",
        "toml",
        "ini",
        "xml",
        "html",
        "markdown",
        "latex",
        "terraform",
        "sql",
        "shellscript",
        "powershell",
        "makefile",
        "cmake",
        "dockerfile",
    }
)
CODE_EXTENSIONS = frozenset(
    extension
    for language in LANGUAGES
    if language.lsp_id not in _DATA_LANGUAGES
    for extension in language.extensions
)
"""Extensions of source code, lower case, without the dot."""

DENY_EXCEPTIONS = (".env.example", ".env.sample", ".env.template", "*.env.example")
"""Templates name the variables without their values: they help completion, and the content
check still skips one that holds a real key."""

DENY_PATHS = (".docker/config.json", ".kube/config")
"""Files that are secrets only in their place: `config.json` elsewhere is ordinary."""

# "secret" or "credential" in the stem of a data or configuration file (`config/secrets.yaml`,
# `client_secret_123.json`, `aws_credentials`, `.secrets`), but not in source code: a module
# `credentials.py` or `secret_manager.go` is code that handles secrets, not a secret.
_SECRET_CONFIG = re.compile(
    r"\.?[^.]*(?:secret|credential)[^.]*"  # no extension
    r"|[^/]*(?:secret|credential)[^/]*"
    r"\.(?:json|ya?ml|toml|ini|cfg|conf|config|properties|env|txt|xml|csv|plist|bak|old)"
)


def _globs(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(fnmatch.translate(p) for p in patterns))


# One regex per list: one combined regex is several times faster than pattern after pattern.
_DIRS = _globs(DENY_DIRS)
_NAMES = _globs(tuple(p for p in DENY_PATTERNS if p not in SOURCE_EXEMPT_PATTERNS))
_SOURCE_EXEMPT = _globs(SOURCE_EXEMPT_PATTERNS)
_EXCEPTIONS = _globs(DENY_EXCEPTIONS)
# The names DENY_PATHS end in: only these need the whole path looked at.
_PLACED_NAMES = frozenset(place.rsplit("/", 1)[-1] for place in DENY_PATHS)

# A line break in a key block: a real one, or `\n` escaped in JSON or a string literal, with the
# indentation, quotes and `+` of YAML blocks and concatenated literals around it.
_FILL = rb"[ \t\"'+]*"
_BREAKS = rb"(?:" + _FILL + rb"(?:\r?\n|\\r\\n|\\n))+" + _FILL

# One regex per kind, tried only when one of its literals occurs: a `bytes in bytes` search is
# about ten times faster than one combined regex, so the whole file is checked (about 20 ms a
# megabyte, far below what chunking and embedding it costs) and not only its head.
_TOKEN_PATTERNS: tuple[tuple[str, tuple[bytes, ...], re.Pattern[bytes]], ...] = (
    (
        "private_key",
        (b"PRIVATE KEY",),
        # A header followed by base64 (after optional `Proc-Type:` lines), on the next line or
        # after a space: a parser's string constant naming the header is not a key.
        re.compile(
            rb"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----(?:" + _BREAKS + rb"|[ \t]+)"
            rb"(?:[A-Za-z-]+:[^\r\n\\\"']*" + _BREAKS + rb"){0,4}[A-Za-z0-9+/=]{40,}"
        ),
    ),
    ("putty_key", (b"PuTTY-User-Key-File-",), re.compile(rb"PuTTY-User-Key-File-\d: ")),
    # AWS's documentation example (`AKIAIOSFODNN7EXAMPLE`) is not a key.
    (
        "aws_access_key",
        (b"AKIA", b"ASIA", b"ABIA", b"ACCA"),
        re.compile(rb"\b(?:AKIA|ASIA|ABIA|ACCA)(?![A-Z0-9]{9}EXAMPLE)[A-Z0-9]{16}\b"),
    ),
    (
        "github_token",
        (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
        re.compile(rb"\bgh[pousr]_[A-Za-z0-9]{36}\b"),
    ),
    ("github_token", (b"github_pat_",), re.compile(rb"\bgithub_pat_[A-Za-z0-9_]{82}")),
    ("gitlab_token", (b"glpat-",), re.compile(rb"\bglpat-[A-Za-z0-9_-]{20}")),
    ("slack_token", (b"xox",), re.compile(rb"\bxox[abeoprs]-(?:[0-9]+-)+[A-Za-z0-9]{8,}")),
    (
        "slack_webhook",
        (b"hooks.slack.com",),
        re.compile(rb"hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]{16,}"),
    ),
    ("google_api_key", (b"AIza",), re.compile(rb"\bAIza[0-9A-Za-z_-]{35}")),
    ("stripe_key", (b"_live_",), re.compile(rb"\b[rs]k_live_[0-9A-Za-z]{24,}")),
    ("npm_token", (b"npm_",), re.compile(rb"\bnpm_[A-Za-z0-9]{36}\b")),
    ("pypi_token", (b"pypi-",), re.compile(rb"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}")),
    (
        "openai_key",
        (b"T3BlbkFJ",),
        re.compile(rb"\bsk-[A-Za-z0-9_-]{20,}T3BlbkFJ[A-Za-z0-9_-]{20,}"),
    ),
    ("anthropic_key", (b"sk-ant-",), re.compile(rb"\bsk-ant-[a-z0-9]+-[A-Za-z0-9_-]{80,}")),
)

RULES_VERSION = hashlib.sha256(
    repr(
        (
            DENY_DIRS,
            DENY_PATTERNS,
            SOURCE_EXEMPT_PATTERNS,
            sorted(CODE_EXTENSIONS),
            DENY_EXCEPTIONS,
            DENY_PATHS,
            _SECRET_CONFIG.pattern,
            [p.pattern for *_, p in _TOKEN_PATTERNS],
        )
    ).encode()
).hexdigest()[:16]
"""Changes with the rules: an index built under other rules looks at every file again."""


def is_denied(rel_path: str, is_dir: bool = False) -> bool:
    """True when a path relative to the workspace root (or a bare name) is a secret by name.

    A denied directory anywhere on the path decides (`.ssh/config`); file patterns apply to the
    last component of a file. Case is ignored.
    """
    parts = rel_path.lower().split("/")
    if any(_DIRS.match(part) is not None for part in parts[:-1]):
        return True
    return _denied_name(parts[-1], is_dir, parts)


def is_denied_entry(rel_dir: str, name: str, is_dir: bool) -> bool:
    """`is_denied(rel_dir/name)` for a walk that has already let `rel_dir` through: only the
    entry's own name is looked at (and its place, for `DENY_PATHS`)."""
    lower = name.lower()
    if lower in _PLACED_NAMES:
        return _denied_name(lower, is_dir, f"{rel_dir}/{name}".lower().split("/"))
    return _denied_name(lower, is_dir, None)


def _denied_name(name: str, is_dir: bool, parts: list[str] | None) -> bool:
    """Whether the last component `name` (lower case) is denied; `parts` is the whole path in
    components when `name` may be a file that is a secret in its place only."""
    if _DIRS.match(name) is not None:
        return True
    if is_dir:
        return False
    if (_NAMES.match(name) is not None or _source_exempt_denies(name)) and (
        _EXCEPTIONS.match(name) is None
    ):
        return True
    if parts is not None and name in _PLACED_NAMES:
        path = "/".join(parts)
        if any(path == place or path.endswith("/" + place) for place in DENY_PATHS):
            return True
    return _SECRET_CONFIG.fullmatch(name) is not None


def _source_exempt_denies(name: str) -> bool:
    """A copy (`secrets.env.bak`) is denied; a source file (`vite.env.d.ts`) is not."""
    if _SOURCE_EXEMPT.match(name) is None:
        return False
    return name.rsplit(".", 1)[-1] not in CODE_EXTENSIONS


def find_secret(data: bytes) -> str | None:
    """The kind of the first credential found in `data` (`private_key`, `aws_access_key`, ...),
    or None."""
    for kind, literals, pattern in _TOKEN_PATTERNS:
        if any(literal in data for literal in literals) and pattern.search(data) is not None:
            return kind
    return None
