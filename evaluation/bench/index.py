"""`tabloop bench index`: what the semantic index costs, each figure beside its baseline.

- `embed_only_chunks_per_s` (baseline) and `index_chunks_per_s`: the bundled model, in the
  index's default embedder (`embedding_engine`: ONNX Runtime), embedding the corpus's chunks
  alone, and the whole pipeline (scan, hash, chunk, embed, SQLite, FAISS, save) on the same
  corpus from an empty cache; `pipeline_overhead` is their ratio minus one. Each is the best of
  `--repeats` runs, alternated, so a busy machine hurts both alike. The best pipeline run is
  split into `pipeline_model_s` (inside the model's calls) and `pipeline_outside_model_s` (scan,
  read, secret check, hash, chunk, SQLite, FAISS, save): `outside_model_overhead` is the second
  over the first, what the pipeline adds to embedding whatever the machine's load does to the
  model; `model_calls_overhead` compares the pipeline's model time with the embed-only run's (its
  calls of one commit's chunks against one call of everything). `..._cpu_s` are the process's
  CPU times of the same best runs, `..._busy_threads_all` how many threads did a tenth of each
  run's CPU work (the model's threads). `load_average_1m` (before and after), `cpus`,
  `embedding_engine`, `embedding_threads`, `commit` and `command` say where and how the figures
  were taken.
- `restart_ms`: reopening the up-to-date index until it is ready (nothing embedded).
- `edit_to_searchable_ms_p50/_p95`: a new function appended to one file (on disk, then
  `update_document`) until its chunk and vector are in the index, excluding the watcher's
  debounce.
- `search_ms_p50/_p95`: one query, embedding included.
- `bytes_per_chunk`: resident memory of an open store per chunk, from a synthetic store of
  `--memory-chunks` chunks (RSS delta); `vector_bytes_per_chunk` is FAISS's share.
- `scan_files`, `scan_cold_ms`, `rescan_nochange_ms` (median) on `--scan-path` (default: the
  virtual environment's site-packages), with `stat_only_ms` (baseline: one `os.stat` per file
  in a plain loop) and `rescan_ms_per_50k_files`.

The corpus (`--path`) defaults to a copy of a few standard-library modules, named in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embed import QUERY_TEXTS, Embedder
from indexer.embed_onnx import load_embedder
from indexer.pipeline import chunker_for
from indexer.scan import FileStat, Scanner, StatCache, read_file
from indexer.service import WorkspaceIndex
from indexer.settings import IndexSettings
from indexer.store import FileUpdate, IndexStore
from indexer.types import Chunk

CORPUS = ("textwrap.py", "heapq.py", "bisect.py", "fnmatch.py", "shlex.py", "colorsys.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
QUERIES = (
    "wrap text to a width",
    "priority queue push",
    "split a shell command line",
    "match file names against a wildcard",
    "convert colours between RGB and HSV",
    "binary search in a sorted list",
    "quote a string for the shell",
    "merge sorted streams",
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def settings_for_bench() -> IndexSettings:
    return IndexSettings(watch=False, rescan_interval_s=0.0)


def corpus_chunks(root: Path, embedder: Embedder) -> list[Chunk]:
    """The distinct chunks the index makes of the corpus (same chunker, same settings)."""
    chunker = chunker_for(embedder, settings_for_bench())
    chunks: dict[str, Chunk] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for chunk in chunker.chunk(rel, path.read_text(encoding="utf-8", errors="replace")):
            chunks.setdefault(chunk.id, chunk)
    return list(chunks.values())


class TimedEmbedder:
    """The bench's embedder with a clock on its model calls: how much of a pipeline run the
    model took, and what it was given."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.dimension = embedder.dimension
        self.max_tokens = embedder.max_tokens
        self.counter = embedder.counter
        self.seconds = 0.0
        self.calls: list[int] = []

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        try:
            return self.embedder.embed(texts)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls.append(len(texts))


@dataclass
class Run:
    """One timed run: wall and CPU seconds, and for a pipeline what its model calls took."""

    seconds: float
    cpu_seconds: float
    chunks: int
    model_seconds: float = 0.0
    model_calls: tuple[int, ...] = ()
    busy_threads: int = 0


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads, by thread id (Linux; else empty)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    try:
        ids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in ids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        found[tid] = (int(fields[11]) + int(fields[12])) / tick
    return found


def busy_threads(before: dict[str, float], after: dict[str, float], cpu_seconds: float) -> int:
    """Threads that did a tenth of a run's CPU work: how many threads the model really ran on."""
    return sum(1 for tid, t in after.items() if t - before.get(tid, 0.0) >= cpu_seconds / 10)


def embed_only(embedder: Embedder, chunks: list[Chunk]) -> Run:
    """All texts in one call: sentence-transformers sorts them by length and pads least, the
    most favourable baseline for the pipeline to be compared with.

    The call runs on a new thread, as the pipeline's model calls do on the index's worker: on
    the 2-core development machine the same texts took 1.4-1.5 times the CPU on the main thread
    (docs/indexer.md), which the comparison would otherwise count for or against the pipeline.
    """
    times: list[float] = []
    threads_after: list[dict[str, float]] = []

    def call() -> None:
        started = time.perf_counter()
        embedder.embed([c.text for c in chunks])
        times.append(time.perf_counter() - started)
        threads_after.append(thread_cpu())  # while this thread and its helpers are alive

    cpu, threads = time.process_time(), thread_cpu()
    worker = threading.Thread(target=call, name="bench-embed-only")
    worker.start()
    worker.join()
    if not times:
        raise RuntimeError("the embed-only run failed (see the thread's traceback above)")
    cpu = time.process_time() - cpu
    busy = busy_threads(threads, threads_after[0], cpu)
    return Run(times[0], cpu, len(chunks), busy_threads=busy)


def pipeline(root: Path, cache: Path, embedder: TimedEmbedder) -> tuple[Run, WorkspaceIndex]:
    shutil.rmtree(cache, ignore_errors=True)
    embedder.reset()
    started, cpu, threads = time.perf_counter(), time.process_time(), thread_cpu()
    index = WorkspaceIndex(root, settings_for_bench(), cache, embedder=embedder)
    index.start()
    index.wait_idle()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    stats = index.last_stats
    embedded = stats.chunks_embedded if stats else 0
    busy = busy_threads(threads, thread_cpu(), cpu)
    return Run(elapsed, cpu, embedded, embedder.seconds, tuple(embedder.calls), busy), index


def pipeline_figures(embed_runs: list[Run], pipe_runs: list[Run]) -> dict[str, Any]:
    """Throughputs of the best runs of each kind, and where the best pipeline run's time went."""
    best_embed = min(embed_runs, key=lambda r: r.seconds)
    best_pipe = min(pipe_runs, key=lambda r: r.seconds)
    embed_rate = best_embed.chunks / best_embed.seconds
    index_rate = best_pipe.chunks / best_pipe.seconds
    outside = best_pipe.seconds - best_pipe.model_seconds
    # Per chunk, in case the pipeline embeds other chunks than the corpus's (`--path` trees
    # with files other than Python).
    model_rate = best_pipe.chunks / best_pipe.model_seconds if best_pipe.model_seconds else 0.0
    return {
        "chunks_embedded": best_pipe.chunks,
        "embed_only_chunks_per_s": round(embed_rate, 2),
        "index_chunks_per_s": round(index_rate, 2),
        "pipeline_overhead": round(embed_rate / index_rate - 1, 3),
        "embed_only_s": round(best_embed.seconds, 3),
        "pipeline_s": round(best_pipe.seconds, 3),
        "pipeline_model_s": round(best_pipe.model_seconds, 3),
        "pipeline_outside_model_s": round(outside, 3),
        "outside_model_overhead": round(outside / max(best_pipe.model_seconds, 1e-9), 3),
        "model_calls_overhead": round(embed_rate / model_rate - 1, 3) if model_rate else None,
        "pipeline_model_calls": list(best_pipe.model_calls),
        "embed_only_cpu_s": round(best_embed.cpu_seconds, 3),
        "pipeline_cpu_s": round(best_pipe.cpu_seconds, 3),
        "embed_only_s_all": [round(r.seconds, 3) for r in embed_runs],
        "pipeline_s_all": [round(r.seconds, 3) for r in pipe_runs],
        "embed_only_busy_threads_all": [r.busy_threads for r in embed_runs],
        "pipeline_busy_threads_all": [r.busy_threads for r in pipe_runs],
    }


def measure_edits(index: WorkspaceIndex, root: Path, edits: int, seed: int) -> list[float]:
    """Append a function to a random file; time until its chunk is in the index (committed to
    SQLite and FAISS together, so the next search can return it)."""
    rng = random.Random(seed)
    files = sorted(root.rglob("*.py"))
    times = []
    for i in range(edits):
        path = rng.choice(files)
        name = f"zebra{i}quokka_handler"
        text = path.read_text(encoding="utf-8")
        line = len(text.splitlines()) + 2
        path.write_text(f"{text}\n\ndef {name}(value):\n    return value * {i}\n", "utf-8")
        started = time.perf_counter()
        index.update_document(path, None)
        deadline = started + 60
        while time.perf_counter() < deadline:
            chunk = index.chunk_at(path, line)
            if chunk is not None and name in chunk.text:
                break
            time.sleep(0.002)
        else:
            raise RuntimeError(f"edit {i} not indexed within 60 s: {index.status()}")
        times.append((time.perf_counter() - started) * 1000)
    return times


def measure_memory(chunks: int, dimension: int, workdir: Path) -> dict[str, float]:
    """RSS per chunk of an open store with `chunks` synthetic chunks of realistic size."""
    directory = workdir / "memory-store"
    store = IndexStore(directory, dimension=dimension, model_id="bench:synthetic")
    rng = np.random.default_rng(0)
    per_file = 20
    for start in range(0, chunks, 2000):
        updates = []
        for f in range(start // per_file, min(start + 2000, chunks) // per_file):
            texts = [
                f"def function_{f}_{j}(x):\n" + "    y = x + 1\n" * 40 for j in range(per_file)
            ]
            file_chunks = [
                Chunk(f"pkg/m{f}.py", j * 41, j * 41 + 41, "python", t) for j, t in enumerate(texts)
            ]
            vectors = rng.standard_normal((per_file, dimension)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            stat = FileStat(1, 1, 1, bytes(32))
            by_id = {c.id: v for c, v in zip(file_chunks, vectors, strict=True)}
            updates.append(FileUpdate(f"pkg/m{f}.py", stat, file_chunks, by_id))
        store.apply(updates, [])
    store.save()
    store.close()
    # A fresh interpreter: in this one, memory freed by the store above would be reused and
    # hide the cost of opening it.
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from evaluation.bench.index import open_store_rss; "
            f"open_store_rss({str(directory)!r}, {dimension})",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    count = figures["chunks"]
    disk = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    return {
        "memory_chunks": count,
        "bytes_per_chunk": round(figures["rss_delta"] / count, 1),
        "vector_bytes_per_chunk": round(figures["vector_bytes"] / count, 1),
        "disk_bytes_per_chunk": round(disk / count, 1),
    }


def open_store_rss(directory: str, dimension: int) -> None:
    """(Child process) print the RSS growth of opening a store and searching it once."""
    before = rss_bytes()
    store = IndexStore(Path(directory), dimension=dimension, model_id="bench:synthetic")
    store.search(np.ones(dimension, np.float32) / np.sqrt(dimension), 10)
    after = rss_bytes()
    figures = {
        "rss_delta": after - before,
        "vector_bytes": store.vectors.memory_bytes(),
        "chunks": store.counts()[1],
    }
    store.close()
    print(json.dumps(figures))


def measure_scan(root: Path, repeats: int) -> dict[str, Any]:
    scanner = Scanner(root)
    cache = StatCache()
    started = time.perf_counter()
    first = scanner.scan(cache)
    for rel in first.changed:
        stat = read_file(root, rel, IndexSettings().max_file_bytes).stat
        try:
            st = os.stat(root / rel)
        except OSError:
            continue
        # As a later pass records them once they are no longer racy.
        cache.files[rel] = FileStat(st.st_mtime_ns, st.st_size, st.st_ino, stat.digest, stat.skip)
    cold = (time.perf_counter() - started) * 1000
    scanner.scan(cache)  # settles per-directory keys, as the first rescan after a run does
    rescans = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = scanner.scan(cache)
        rescans.append((time.perf_counter() - started) * 1000)
        assert not result.changed and not result.removed, "the scan tree changed under the bench"
    paths = [str(root / rel) for rel in cache.files]
    stats = []
    for _ in range(repeats):
        started = time.perf_counter()
        for path in paths:
            os.stat(path)
        stats.append((time.perf_counter() - started) * 1000)
    rescan = statistics.median(rescans)
    return {
        "scan_path": str(root),
        "scan_files": first.files_seen,
        "scan_cold_ms": round(cold, 1),
        "rescan_nochange_ms": round(rescan, 1),
        "stat_only_ms": round(statistics.median(stats), 1),
        "rescan_ms_per_50k_files": round(rescan * 50_000 / max(1, first.files_seen), 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-index-") as temp:
        workdir = Path(temp)
        root = workdir / "corpus"
        if args.path:
            shutil.copytree(args.path, root, ignore=shutil.ignore_patterns(".git"))
            result["corpus"] = str(args.path)
        else:
            stdlib = Path(sysconfig.get_paths()["stdlib"])
            root.mkdir()
            for name in CORPUS:
                shutil.copy(stdlib / name, root / name)
            result["corpus"] = "stdlib: " + ", ".join(CORPUS)
        settings = settings_for_bench()
        # The index's embedder at the defaults (ONNX Runtime for the bundled model).
        model = load_embedder(
            settings.embedding_model,
            cache_dir=workdir / "models",
            batch_size=settings.embed_batch_size,
            engine=settings.embedding_engine,
        )
        # More texts than a query (a query's call may take another path), exported and loaded.
        model.embed([f"warm up the model {n}" for n in range(QUERY_TEXTS + 1)])
        result["embedding_engine"] = getattr(model, "engine", "")
        result["embedding_threads"] = getattr(model, "threads", None)
        embedder = TimedEmbedder(model)
        chunks = corpus_chunks(root, model)
        result["corpus_chunks"] = len(chunks)
        embed_runs: list[Run] = []
        pipe_runs: list[Run] = []
        index: WorkspaceIndex | None = None
        for repeat in range(args.repeats):
            embed_runs.append(embed_only(model, chunks))
            if index is not None:
                index.close()
            pipe_run, index = pipeline(root, workdir / f"cache{repeat}", embedder)
            pipe_runs.append(pipe_run)
        assert index is not None
        result.update(pipeline_figures(embed_runs, pipe_runs))
        cache = Path(index.cache_dir)
        index.close()
        started = time.perf_counter()
        index = WorkspaceIndex(root, settings_for_bench(), cache, embedder=embedder)
        index.start()
        index.wait_idle()
        result["restart_ms"] = round((time.perf_counter() - started) * 1000, 1)
        result["restart_chunks_embedded"] = (
            index.last_stats.chunks_embedded if index.last_stats else -1
        )
        edits = measure_edits(index, root, args.edits, args.seed)
        result["edit_to_searchable_ms_p50"] = round(percentile(edits, 0.5), 1)
        result["edit_to_searchable_ms_p95"] = round(percentile(edits, 0.95), 1)
        searches = []
        for i in range(args.searches):
            started = time.perf_counter()
            index.search(QUERIES[i % len(QUERIES)], 10)
            searches.append((time.perf_counter() - started) * 1000)
        result["search_ms_p50"] = round(percentile(searches, 0.5), 2)
        result["search_ms_p95"] = round(percentile(searches, 0.95), 2)
        index.close()
        result.update(measure_memory(args.memory_chunks, embedder.dimension, workdir))
    scan_root = args.scan_path or Path(sysconfig.get_paths()["purelib"])
    result.update(measure_scan(scan_root, args.scan_repeats))
    return result


def main(argv: list[str]) -> int:
    """Run the index benchmark and print its figures as JSON."""
    parser = argparse.ArgumentParser(prog="tabloop bench index", description=__doc__)
    parser.add_argument("--path", type=Path, help="corpus to embed (copied; default: stdlib part)")
    parser.add_argument("--scan-path", type=Path, help="tree for the scan figures")
    parser.add_argument("--repeats", type=int, default=3, help="embedding runs of each kind")
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--memory-chunks", type=int, default=20_000)
    parser.add_argument("--scan-repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    print(json.dumps({**conditions(argv), **run(args), **after()}, indent=2))
    return 0


def conditions(argv: list[str]) -> dict[str, Any]:
    """The command, the code and the machine the figures come from."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(REPO_ROOT),
                "status",
                "--porcelain",
                "--",
                "indexer",
                "evaluation/bench/index.py",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        commit += " (indexer or the bench modified)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = ""
    return {
        "command": " ".join(["tabloop bench index", *argv]),
        "commit": commit,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def after() -> dict[str, Any]:
    return {"load_average_1m_after": round(os.getloadavg()[0], 2)}
