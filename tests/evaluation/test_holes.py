"""`tabloop eval holes`: scoring, hole sampling, and a whole run on a scripted model.

The run's model answers what each test chooses (a scripted model behind a loopback
OpenAI-compatible server), so the scores it reports are known exactly beforehand.
"""

from __future__ import annotations

import argparse
import ast
import math
import random
import shutil
import sysconfig
from pathlib import Path

import pytest

from completion.types import CancelToken, Generation, StopRule
from evaluation.holes import (
    Hole,
    corpus_files,
    edit_similarity,
    ignores_partial,
    ignores_unknown_partial,
    levenshtein,
    mid_word,
    parse_args,
    run_holes,
    sample_holes,
    typed_word_is_a_name,
)
from tests.support.completion_server import serve_completions
from tests.support.fixtures import tiny_embedder_path
from tests.support.scripted_model import ScriptedModel

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS_FILES = ("colorsys.py", "bisect.py", "fnmatch.py")


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        pytest.param("", "", 0, id="empty"),
        pytest.param("abc", "abc", 0, id="equal"),
        pytest.param("kitten", "sitting", 3, id="classic"),
        pytest.param("", "abc", 3, id="insertions"),
        pytest.param("return x", "return y", 1, id="substitution"),
    ],
)
def test_levenshtein(a: str, b: str, distance: int) -> None:
    assert levenshtein(a, b) == distance == levenshtein(b, a)


def test_edit_similarity_bounds() -> None:
    assert edit_similarity("", "") == 1.0
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("abc", "xyz") == 0.0
    assert 0 < edit_similarity("return x + 1", "return x + 2") < 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for name in CORPUS_FILES:
        shutil.copy(STDLIB / name, root / name)
    return root


def test_holes_put_back_give_the_file(corpus: Path) -> None:
    files = sorted(corpus.glob("*.py"))
    holes = sample_holes(files, 60, random.Random(3))
    assert len(holes) == 60
    assert {h.kind for h in holes} == {"line", "block"}
    for hole in holes:
        assert hole.prefix + hole.truth + hole.suffix == hole.path.read_text(encoding="utf-8")
        assert hole.truth.strip()
    assert sample_holes(files, 60, random.Random(3)) == holes  # reproducible


# The run's corpus: small files, so that every prompt holds the whole code before the cursor,
# with no strings or comments, and no `@` or `$` anywhere.
RUN_CORPUS = {
    "shapes.py": """\
import math


def circle_area(radius):
    squared = radius * radius
    return math.pi * squared


def ring_area(outer, inner):
    big = circle_area(outer)
    small = circle_area(inner)
    return big - small


class Rectangle:
    def __init__(self, width, height):
        self.width = width
        self.height = height

    def area(self):
        return self.width * self.height
""",
    "words.py": """\
def count_words(text):
    pieces = text.split()
    return len(pieces)


def longest_word(text):
    best = None
    for word in text.split():
        if best is None or len(word) > len(best):
            best = word
    return best


def shout(text):
    louder = text.upper()
    return louder + chr(33)
""",
    "numbers.py": """\
def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def mean(values):
    total = sum(values)
    count = len(values)
    return total / count if count else 0.0


def running_totals(values):
    totals = []
    current = 0
    for value in values:
        current += value
        totals.append(current)
    return totals
""",
}
# This seed's holes lie in all three files; hole 1 is the block hole at `for word in ...:`.
HOLES, SEED = 8, 1
# What the scripted model answers at a hole.
TRUTH = "truth"  # the hidden text itself
FIRST_LINE = "first line"  # only the first line of a block hole's hidden text
WRONG = "@$@"  # shares no character with any truth and never parses
SNIPPET_MARK = "<|file_sep|>"  # snippets from other files in a Qwen prompt


def answer(hole: Hole, kind: str) -> str:
    return {TRUTH: hole.truth, FIRST_LINE: hole.truth.split("\n", 1)[0]}.get(kind, WRONG)


def scripted_answers(holes: list[Hole], kinds: dict[int, str]) -> ScriptedModel:
    """`answer(hole, kinds[i])` at hole number i, `WRONG` at holes not in `kinds`.

    Each rule's key is the hole's whole prefix (the prompt holds all of it). A longer prefix may
    end with a shorter one, so the longest keys come first: each hole gets its own answer.
    """
    rules = []
    for i, hole in enumerate(holes):
        key, text = hole.prefix, answer(hole, kinds.get(i, WRONG))
        line_prefix = key[key.rfind("\n") + 1 :]
        if line_prefix and not line_prefix.strip():
            # A prompt after typed indentation ends at the line break (`promptAtLineBreak`):
            # the model writes the indentation itself.
            key, text = key[: len(key) - len(line_prefix)], line_prefix + text
        rules.append((key, text))
    return ScriptedModel(rules=dict(sorted(rules, key=lambda rule: -len(rule[0]))))


class ByRetrieval:
    """One model answering prompts without snippets from `plain`, those with from `retrieved`."""

    model_id = "scripted"
    family = "qwen"

    def __init__(self, plain: ScriptedModel, retrieved: ScriptedModel) -> None:
        self.plain = plain
        self.retrieved = retrieved

    def count_tokens(self, text: str) -> int:
        return self.plain.count_tokens(text)

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
    ) -> Generation:
        model = self.retrieved if SNIPPET_MARK in prompt else self.plain
        return model.generate(
            prompt, max_new_tokens=max_new_tokens, stop=stop, cancel=cancel, temperature=temperature
        )

    def close(self) -> None:
        pass


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def expected_scores(holes: list[Hole], kinds: dict[int, str]) -> dict[str, object]:
    """A run's scores when the model answers as `scripted_answers(holes, kinds)` does."""
    exact, similarity, parsed = [], [], []
    for number, hole in enumerate(holes):
        kind = kinds.get(number, WRONG)
        if kind == TRUTH:  # the file as it is: right, and it parses
            exact.append(True)
            similarity.append(1.0)
            parsed.append(True)
        elif kind == FIRST_LINE:
            # The truth minus its other lines; the first line opens a block, which alone has no
            # body and does not parse.
            exact.append(True)
            similarity.append(len(answer(hole, kind)) / len(hole.truth))
            parsed.append(False)
        else:  # `WRONG`: every character of the longer text must be edited; `$` never parses
            exact.append(False)
            similarity.append(0.0)
            parsed.append(False)
    left_empty = [_parses(h.prefix + h.suffix) for h in holes]
    cut_words = [h for h in holes if mid_word(h)]
    # A right answer continues the word; `WRONG` starts with `@`, a new token.
    ignoring = [kinds.get(holes.index(h), WRONG) == WRONG for h in cut_words]
    unknown = [i and not typed_word_is_a_name(h) for i, h in zip(ignoring, cut_words, strict=True)]
    share = sum(exact) / len(holes)
    return {
        "n": len(holes),
        "exact_line_match": round(sum(exact) / len(holes), 4),
        "edit_similarity": round(sum(similarity) / len(holes), 4),
        "parses": round(sum(parsed) / len(holes), 4),
        "parses_if_left_empty": round(sum(left_empty) / len(holes), 4),
        "empty_suggestions": 0,
        "mid_word_holes": len(cut_words),
        "mid_word_ignores_partial": round(sum(ignoring) / len(ignoring), 4) if ignoring else None,
        "mid_word_ignores_unknown_partial": round(sum(unknown) / len(unknown), 4)
        if unknown
        else None,
        "exact_line_match_stderr": round(math.sqrt(share * (1 - share) / len(holes)), 4),
    }


def test_a_run_with_and_without_retrieval(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in RUN_CORPUS.items():
        (corpus / name).write_text(text, encoding="utf-8")
    # The run samples the same holes: sampling depends only on the files and the seed.
    holes = sample_holes(corpus_files(corpus), HOLES, random.Random(SEED))
    # Without retrieval the first three holes are right; with it, five others, and only the first
    # line of hole 1's block: each metric then differs between the runs and from the others.
    without = {0: TRUTH, 1: TRUTH, 2: TRUTH}
    with_snippets = {1: FIRST_LINE, 2: TRUTH, 3: TRUTH, 4: TRUTH, 5: TRUTH, 6: TRUTH}
    model = ByRetrieval(scripted_answers(holes, without), scripted_answers(holes, with_snippets))
    with serve_completions(model) as (url, server):
        # The workspace file is one of tabloop's configuration layers; the run reads it.
        (corpus / "tabloop.toml").write_text(
            f'cache_dir = "{tmp_path / "cache"}"\n'
            "[completion]\n"
            f'runner = "http"\nhttp_url = "{url}"\nhttp_model = "scripted"\n'
            'fim_template = "qwen"\nsyntax_check = false\n'
            f'[index]\nembedding_model = "{tiny_embedder_path()}"\n',
            encoding="utf-8",
        )
        args = parse_args(
            [
                *("--corpus", str(corpus), "--n", str(HOLES), "--seed", str(SEED)),
                *("--max-new-tokens", "200"),
            ]
        )
        first = run_holes(args)
        prompts = [request["prompt"] for request in server.requests]
        second = run_holes(args)
        requests_after_rerun = len(server.requests)
        # The same outputs again, through the syntax check (`--set syntax_check=true`).
        checked = run_holes(argparse.Namespace(**{**vars(args), "set": ["syntax_check=true"]}))
        requests_after_check = len(server.requests)
        # Against a setting that drops every suggestion as too short, on the same holes.
        against = run_holes(argparse.Namespace(**{**vars(args), "against": ["min_chars=1000"]}))

    # One model call per hole and run. Every prompt with retrieval held snippets from other
    # files (the corpus has fewer chunks than one search returns), and none without.
    assert (first["model_runs"], first["cached_outputs_used"]) == (2 * HOLES, 0)
    assert [SNIPPET_MARK in prompt for prompt in prompts] == [False] * HOLES + [True] * HOLES
    for run, kinds in (("without_retrieval", without), ("with_retrieval", with_snippets)):
        scores = dict(first[run])
        assert scores.pop("latency_ms_p50") is not None
        scores.pop("latency_ms_p95")
        assert scores.pop("token_healing") is True  # asked, but an HTTP runner cannot follow it
        assert set(scores.pop("context_ms")) == {"p50", "p95"}
        assert scores.pop("prompts_with_snippets") == (1.0 if run == "with_retrieval" else 0.0)
        assert scores == expected_scores(holes, kinds), run
        # The syntax check: the suggestions before it are the unchecked run's; what it changed
        # is counted, it never lowers the parse rate, and it only cuts (exact-line may drop
        # where a cut removed the first line; it cannot rise).
        report = checked[run]["syntax_check"]
        assert report["without_check"] == {
            key: first[run][key]
            for key in ("exact_line_match", "edit_similarity", "parses", "empty_suggestions")
        }
        assert sum(report["outcomes"].values()) == HOLES
        assert report["changed"] == report["outcomes"].get("cut", 0) + report["outcomes"].get(
            "dropped", 0
        )
        assert report["changed"] > 0  # the `@$@` answers break code that parsed
        assert checked[run]["parses"] >= first[run]["parses"]
        assert checked[run]["exact_line_match"] <= first[run]["exact_line_match"]
    assert requests_after_check == 2 * HOLES  # the check needs no model call
    # The other arm ran on the same holes from the output cache; every paired difference is
    # this run's figure minus nothing (ours - theirs).
    other = against["against"]
    assert other["settings"] == {"min_chars": 1000}
    assert (other["model_runs"], other["cached_outputs_used"]) == (0, 2 * HOLES)
    for run in ("without_retrieval", "with_retrieval"):
        assert other[run]["empty_suggestions"] == HOLES
        pairs = other[run]["paired"]
        assert pairs["n"] == HOLES
        assert pairs["exact_line_match"]["mean"] == first[run]["exact_line_match"]
        assert pairs["edit_similarity"]["mean"] == pytest.approx(
            first[run]["edit_similarity"], abs=1e-4
        )
        assert pairs["holes_differing"] == HOLES - first[run]["empty_suggestions"]
        assert pairs["exact_line_match"]["stderr"] > 0
        assert "suggestions" not in other[run]
    # A rerun answers every prompt from the output cache and scores the same.
    assert (second["model_runs"], second["cached_outputs_used"]) == (0, 2 * HOLES)
    assert requests_after_rerun == 2 * HOLES
    for run in ("without_retrieval", "with_retrieval"):
        # Latency keeps the model's time from the first run, plus this run's context time.
        first[run].pop("latency_ms_p50")
        first[run].pop("latency_ms_p95")
        second[run].pop("latency_ms_p50")
        second[run].pop("latency_ms_p95")
        first[run].pop("context_ms")  # this run's own time
        second[run].pop("context_ms")
        assert second[run] == first[run]


@pytest.mark.parametrize(
    ("prefix", "truth", "cut"),
    [
        pytest.param("    if isinst", "ance(x, int):", True, id="mid-word"),
        pytest.param("    x = os.pa", "th.join(a)", True, id="mid-dotted-name"),
        pytest.param("    if ", "isinstance(x):", False, id="after-a-space"),
        pytest.param("    return x", " + 1", False, id="word-complete"),
    ],
)
def test_mid_word_holes(prefix: str, truth: str, cut: bool) -> None:
    hole = Hole(Path("m.py"), prefix, truth, "\n", "line", 0, len(prefix))
    assert mid_word(hole) is cut


def test_a_suggestion_that_ignores_the_typed_word() -> None:
    assert ignores_partial(" instream is not None:")
    assert ignores_partial("(x, int):")
    assert not ignores_partial("ance(x, int):")
    assert not ignores_partial("")  # silence ignores nothing


@pytest.mark.parametrize(
    ("prefix", "suffix", "a_name"),
    [
        pytest.param("def f(x):\n    if isinst", "\n", False, id="a-part-of-a-word"),
        # Seen in logging: `name = alogger.name` a line above; the truth was `namelen = ...`.
        pytest.param("    name = a.name\n    name", "\n", True, id="a-name-defined-above"),
        pytest.param("    return tot", "\n    tot = 0\n", True, id="a-name-used-below"),
        pytest.param("    total = 1\n    tot", "\n", False, id="only-inside-a-longer-name"),
        pytest.param("    name = 1\n    x", "\n", False, id="a-letter-inside-names"),
    ],
)
def test_whether_the_typed_part_is_already_a_name(prefix: str, suffix: str, a_name: bool) -> None:
    hole = Hole(Path("m.py"), prefix, "len = 1", suffix, "line", 0, 0)
    assert typed_word_is_a_name(hole) is a_name
    # Starting a new token after it is a failure to see the partial word only when it is not.
    assert ignores_unknown_partial(hole, " = 2") is not a_name
    assert not ignores_unknown_partial(hole, "len = 2")


def test_a_bad_setting_is_a_clear_error(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "m.py").write_text("x = 1\n", encoding="utf-8")
    (corpus / "tabloop.toml").write_text(f'cache_dir = "{tmp_path / "cache"}"\n')
    for bad in ("snippet_min_similarity=2", "no_such_setting=1", "snippet_share"):
        args = parse_args(["--corpus", str(corpus), "--n", "1", "--no-retrieval", "--set", bad])
        with pytest.raises(SystemExit, match="--set"):
            run_holes(args)


def test_against_with_several_engines_is_refused_before_any_run(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "m.py").write_text("x = 1\ny = 2\n", encoding="utf-8")
    (corpus / "tabloop.toml").write_text(f'cache_dir = "{tmp_path / "cache"}"\n')
    # The model cannot be loaded: the refusal must come first.
    args = parse_args(
        [
            *("--corpus", str(corpus), "--model", "no-such-model"),
            *("--engines", "ctranslate2,torch", "--against", "min_chars=3"),
        ]
    )
    with pytest.raises(SystemExit, match="one engine"):
        run_holes(args)
    assert not (tmp_path / "cache" / "eval").exists()
