"""The embedded model's floor on this machine: how fast it computes prompt tokens and generates,
and the seconds a run's own tokens cannot take less than, per LM step.

    python -m experiments.bench.floor --out rates.json [--lengths 256,512,1024,2048,4096]
    python -m experiments.bench.floor --rates rates.json RUN [RUN ...]

The first form starts the embedded model's server (one slot, every core, as `LocalServer` runs
it) and, per prompt length, sends prompts of real text (MuSiQue passages, a fresh stretch each
time) as token ids with the prompt cache off, generating 32 tokens past the end of text:
llama.cpp's own timings give the prompt tokens computed a second and the tokens generated a
second at that context. The same prompt sent again with the cache on gives what a call whose
prompt is all cached still costs, and a saved slot restored gives what `--pin-prefixes` pays to
bring a prefix back (milliseconds). Each figure is the best of `--repeats`: a floor. Run it with
nothing else on the cores.

The second form reads runs (`hyperprove evaluate --out RUN`: each question's `lm_steps`) and
sets beside each step's measured seconds a question the floor for its tokens: prompt tokens the
server computed at the prefill rate, plus generated tokens at the generation rate, each rate taken
at the step's prompt length a call (interpolated between the measured lengths). Tokens served
from the prompt cache count as free, and so does everything that is not the model's arithmetic
(retrieval, HTTP, DSPy, waiting), which is why the ratio is what a faster program could win
without sending fewer tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "data" / "musique" / "corpus.json"
GENERATED = 32  # tokens generated per measured call
LENGTHS = (256, 512, 1024, 2048, 4096)


# --- measuring the rates -------------------------------------------------------------------------
def measure(lengths: list[int], repeats: int) -> dict:
    """Per prompt length, the best prefill and generation rates, the cost of a fully cached call
    and of a slot restore, from a fresh server of the embedded model."""
    from pipeline.config import LMConfig
    from pipeline.index.corpus import load_corpus
    from pipeline.lm.local import LOCAL_MODEL_SHA256, LocalServer, cpu_threads, local_model_path
    from pipeline.lm.prefix import poster

    config = LMConfig()
    states = Path(tempfile.mkdtemp(prefix="floor-states-"))

    def slots(params) -> None:  # slot save and restore, as `--pin-prefixes` uses them
        params.slot_save_path = f"{states}{os.sep}"
        params.endpoint_slots = True

    threads = cpu_threads(config)
    server = LocalServer(local_model_path(config.local_model_dir), 1, config.local_context, threads, slots)
    post = poster(server.address, timeout=900)
    text = "\n\n".join(f"{p.title}\n{p.text}" for p in load_corpus(CORPUS)[:4000])
    tokens = post("/tokenize", {"content": text})["tokens"]
    needed = sum(lengths) * (repeats + 1)
    if len(tokens) < needed:
        raise SystemExit(f"error: {CORPUS} gives {len(tokens)} tokens; the lengths asked for need {needed}")
    rows, start = [], 0
    for length in lengths:
        best = {"prefill_tok_s": 0.0, "generate_tok_s": 0.0, "cached_call_ms": float("inf"), "restore_ms": float("inf")}
        for _ in range(repeats):
            prompt = tokens[start:start + length]
            start += length
            body = {"prompt": prompt, "n_predict": GENERATED, "ignore_eos": True, "temperature": 0.0, "id_slot": 0}
            timings = post("/completion", {**body, "cache_prompt": False})["timings"]
            best["prefill_tok_s"] = max(best["prefill_tok_s"], 1000 * timings["prompt_n"] / timings["prompt_ms"])
            best["generate_tok_s"] = max(best["generate_tok_s"], 1000 * timings["predicted_n"] / timings["predicted_ms"])
            began = time.perf_counter()
            post("/completion", {**body, "cache_prompt": True, "n_predict": 1})
            best["cached_call_ms"] = min(best["cached_call_ms"], 1000 * (time.perf_counter() - began))
            post("/slots/0?action=save", {"filename": "floor.bin"})
            post("/slots/0?action=erase", {})
            restored = post("/slots/0?action=restore", {"filename": "floor.bin"})
            best["restore_ms"] = min(best["restore_ms"], restored["timings"]["restore_ms"])
        rows.append({"length": length, **{key: round(value, 2) for key, value in best.items()}})
        print(f"{length:>5} prompt tokens: prefill {rows[-1]['prefill_tok_s']:.1f} tok/s, generate {rows[-1]['generate_tok_s']:.1f} tok/s, "
              f"a cached call {rows[-1]['cached_call_ms']:.0f} ms, a restore {rows[-1]['restore_ms']:.0f} ms", file=sys.stderr, flush=True)
    for leftover in states.iterdir():
        leftover.unlink()
    states.rmdir()
    return {"model_sha256": LOCAL_MODEL_SHA256, "cpu_threads": threads, "cores": os.cpu_count(), "generated": GENERATED,
            "repeats": repeats, "rows": rows}


# --- a run against the floor -------------------------------------------------------------------------
class Floor:
    """The measured rates, read at any prompt length (linear between the measured lengths, the
    nearest measured rate outside them)."""

    def __init__(self, rates: dict):
        rows = sorted(rates["rows"], key=lambda row: row["length"])
        self.lengths = np.array([row["length"] for row in rows], dtype=float)
        self.prefill = np.array([row["prefill_tok_s"] for row in rows], dtype=float)
        self.generate = np.array([row["generate_tok_s"] for row in rows], dtype=float)

    def seconds(self, computed: float, generated: float, length: float) -> float:
        """What computing `computed` prompt tokens and generating `generated` takes at a prompt of `length`."""
        return computed / float(np.interp(length, self.lengths, self.prefill)) + generated / float(np.interp(length, self.lengths, self.generate))


def step_costs(rows: list[dict], floor: Floor) -> dict[str, dict]:
    """Per LM step (and "total"), a question's mean calls, tokens, measured seconds and floor."""
    steps: dict[str, dict] = {}
    for row in rows:
        for step, cost in row["lm_steps"].items():
            live = cost["calls"] - cost["cache_hits"]
            computed = cost["prompt_tokens"] - cost["cached_prompt_tokens"]
            spent = steps.setdefault(step, dict.fromkeys(("calls", "cache_hits", "computed", "cached", "generated", "seconds", "floor"), 0.0))
            spent["calls"] += cost["calls"]
            spent["cache_hits"] += cost["cache_hits"]
            spent["computed"] += computed
            spent["cached"] += cost["cached_prompt_tokens"]
            spent["generated"] += cost["completion_tokens"]
            spent["seconds"] += cost["seconds"]
            if live:
                spent["floor"] += floor.seconds(computed, cost["completion_tokens"], cost["prompt_tokens"] / live)
    total = {key: sum(spent[key] for spent in steps.values()) for key in ("calls", "cache_hits", "computed", "cached", "generated", "seconds", "floor")}
    total["seconds"] = sum(row["seconds"] for row in rows)  # the question's wall time: retrieval and the rest included
    return {name: {key: value / len(rows) for key, value in spent.items()} for name, spent in {**steps, "total": total}.items()}


def run_rows(run: Path) -> tuple[str, list[dict]]:
    """A run's label (its folder name, and whether prefixes were pinned) and its program's rows."""
    predictions = json.loads((run / "predictions.json").read_text())
    rows = predictions.get("hyperprove") or next(iter(predictions.values()))
    if not rows or any("lm_steps" not in row for row in rows):
        raise SystemExit(f"error: {run}/predictions.json: rows without lm_steps (a run from before the LM profile)")
    results = json.loads((run / "results.json").read_text()) if (run / "results.json").exists() else {}
    pinned = (results.get("config", {}).get("lm") or {}).get("pin_prefixes")
    return f"{run.name}{' (pinned)' if pinned else ''}", rows


def table(runs: list[Path], rates: dict) -> str:
    floor = Floor(rates)
    lines = ["| run | step | LM calls/q | DSPy cache hits/q | computed prompt tok/q | cached prompt tok/q | generated tok/q | s/q | floor s/q | s/q ÷ floor |",
             "|---|---|" + "---:|" * 8]
    for run in runs:
        label, rows = run_rows(run)
        for step, spent in step_costs(rows, floor).items():
            ratio = spent["seconds"] / spent["floor"] if spent["floor"] else float("nan")
            lines.append(f"| {label} ({len(rows)} q) | {step} | {spent['calls']:.2f} | {spent['cache_hits']:.2f} | {spent['computed']:.0f} | "
                         f"{spent['cached']:.0f} | {spent['generated']:.1f} | {spent['seconds']:.2f} | {spent['floor']:.2f} | {ratio:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders (`hyperprove evaluate --out`) to set against the floor")
    parser.add_argument("--rates", type=Path, help="the rates a measurement wrote (with runs: the floor they are set against)")
    parser.add_argument("--out", type=Path, help="measure the rates and write them here")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths measured, in tokens")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per length; the best is kept")
    args = parser.parse_args(argv)
    if args.out:
        rates = measure([int(part) for part in args.lengths.split(",") if part.strip()], args.repeats)
        args.out.write_text(json.dumps(rates, indent=1) + "\n")
        print(json.dumps(rates["rows"]))
        return 0
    if not args.rates or not args.runs:
        parser.error("give --out FILE to measure, or --rates FILE and run folders to set against it")
    print(table(args.runs, json.loads(args.rates.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
