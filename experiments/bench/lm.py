"""How fast the embedded model answers the program's own prompts, under llama.cpp settings.

    python -m experiments.bench.lm [--questions 3] [--settings default,flash-off,...] [--adapters chat,prefilled]

The prompts are the ones the program sends for the first MuSiQue lm60 dev questions, rebuilt
from their committed evidence chains (`experiments/results/musique-lm60/predictions.json`) with
the built-in demonstrations: per question the decomposition, one hop answer per hop, the final
answer over the answered chain and the carried facts, and a peer's read of its top 5 passages
(`dense`), in that order, so every predictor's prompt alternates with the others' as in a run.
Each setting starts its own server in its own process, answers every prompt once at
temperature 0, and reports what llama.cpp measured: prompt tokens it computed (not those served
from its prompt cache) and their rate, generated tokens and their rate, and the wall seconds. The
first question fills the prompt cache, so the "warm" columns leave it out. Run it on a quiet
machine: another process on the two cores halves every rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pipeline.index.corpus import load_corpus

ROOT = Path(__file__).resolve().parents[2]

PREDICTIONS = ROOT / "experiments" / "results" / "musique-lm60" / "predictions.json"
CORPUS = ROOT.parent / "shared" / "data" / "musique" / "corpus.json"


def _flash(value: int):
    def adjust(params):
        import xllamacpp

        params.flash_attn_type = xllamacpp.llama_flash_attn_type(value)
    return adjust


def _no_poll(params) -> None:
    params.cpuparams.poll = params.cpuparams_batch.poll = 0  # threads sleep, not spin, between work


def _ngram(kind: str, lookup: int | None = None, draft: int | None = None):
    """Self-speculative decoding: the draft is what followed the last matching n-gram of the
    request's own tokens (answers copy names from the evidence, formats copy the demos)."""
    def adjust(params):
        import xllamacpp

        spec = params.speculative
        spec.types = [getattr(xllamacpp.common_speculative_type, f"COMMON_SPECULATIVE_TYPE_{kind.upper()}")]
        target = getattr(spec, kind)
        if lookup is not None:
            target.size_n = lookup
        if draft is not None:
            target.size_m = draft
            spec.draft.n_max = draft
    return adjust


SETTINGS = {  # name -> a change to llama.cpp's parameters before the server starts
    "default": None,  # what `pipeline.lm.local.LocalServer` runs: flash attention "auto" (on here)
    "flash-off": _flash(0),
    "no-poll": _no_poll,
    "ngram-simple": _ngram("ngram_simple"),
    "ngram-simple-3-8": _ngram("ngram_simple", 3, 8),
}


def question_calls(questions: int) -> list[list[tuple[str, str, dict]]]:
    """Per question, (step, signature name, inputs) of the calls the program and a peer make."""
    from modules.lm.predictors import EVIDENCE_PASSAGES, evidence_line

    runs = json.loads(PREDICTIONS.read_text())
    corpus = load_corpus(CORPUS)
    peer = {row["id"]: row for row in runs["dense"]}
    calls = []
    for row in runs["hyperprove"][:questions]:
        steps = [("Decomposer", "decompose", {"question": row["question"]})]
        carried, answered = {}, []
        for hop in row["chain"]:
            facts = hop["facts"]
            evidence = [f"[{n}] {evidence_line(f['title'], f['text'])}" for n, f in enumerate(facts, start=1)]
            steps.append(("HopAnswerer", "answer_hop", {"question": hop["query"], "evidence": evidence}))
            kept = [f for f in facts if f["id"] in set(hop["supporting"])] or facts
            carried.update({f["id"]: evidence_line(f["title"], f["text"]) for f in kept})
            answered.append(f"{hop['query']} -> {hop['answer']}")
        steps.append(("AnswerGenerator", "generate", {"question": row["question"], "evidence": answered + list(carried.values())}))
        passages = [evidence_line(corpus[p].title, corpus[p].text) for p in peer[row["id"]]["passages"][:EVIDENCE_PASSAGES]]
        steps.append(("reader (peer)", "generate", {"question": row["question"], "evidence": passages}))
        calls.append(steps)
    return calls


def run_setting(name: str, questions: int, adapter_name: str) -> dict:
    """Starts a server with the setting, sends every prompt once; llama.cpp's timings per call."""
    from pipeline.config import LMConfig
    from pipeline.lm.adapters import make_adapter
    from pipeline.lm.local import LocalServer, local_model_path
    from pipeline.program import HyperProve

    config = LMConfig()
    program = HyperProve(None)
    predictors = {"decompose": program.decompose.decompose, "answer_hop": program.answer_hop.answer,
                  "generate": program.generate.generate}
    adapter = make_adapter(adapter_name)
    started = time.perf_counter()
    cpu_threads = config.local_cpu_threads or os.cpu_count() or 1  # as `LocalServer.get` picks them
    server = LocalServer(local_model_path(config.local_model_dir), 1, config.local_context, cpu_threads, SETTINGS[name])
    load_seconds = time.perf_counter() - started
    rows = []
    for position, steps in enumerate(question_calls(questions)):
        for step, predictor_name, inputs in steps:
            predictor = predictors[predictor_name]
            messages = adapter.format(predictor.signature, predictor.demos, inputs)
            stops = {"stop": adapter.stops(predictor.signature)} if hasattr(adapter, "stops") else {}
            body = json.dumps({"messages": messages, "temperature": 0.0, "max_tokens": config.max_tokens, **stops}).encode()
            request = urllib.request.Request(f"{server.address}/v1/chat/completions", body, {"Content-Type": "application/json"})
            began = time.perf_counter()
            with urllib.request.urlopen(request, timeout=900) as response:
                reply = json.loads(response.read())
            timings, usage = reply.get("timings", {}), reply.get("usage", {})
            rows.append({
                "question": position, "step": step, "seconds": time.perf_counter() - began,
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                "computed_tokens": timings.get("prompt_n", 0), "prompt_ms": timings.get("prompt_ms", 0.0),
                "generated_tokens": timings.get("predicted_n", 0), "generate_ms": timings.get("predicted_ms", 0.0),
                "drafted_tokens": timings.get("draft_n", 0), "accepted_tokens": timings.get("draft_n_accepted", 0),
                "answer": reply["choices"][0]["message"]["content"],
            })
    return {"setting": name, "adapter": adapter_name, "load_seconds": load_seconds, "calls": rows}


def answer_text(reply: str) -> str:
    """A reply without the completed marker, which a prefilled reply stops before."""
    return reply.split("[[ ## completed ## ]]")[0].strip()


def summary(result: dict, questions: int) -> dict:
    warm = [r for r in result["calls"] if r["question"] > 0] or result["calls"]
    warm_questions = max(1, questions - 1)
    total = lambda rows, key: sum(r[key] for r in rows)  # noqa: E731
    return {
        "computed tok/s": 1000 * total(warm, "computed_tokens") / max(total(warm, "prompt_ms"), 1e-9),
        "generated tok/s": 1000 * total(warm, "generated_tokens") / max(total(warm, "generate_ms"), 1e-9),
        "warm prompt tok/q": total(warm, "prompt_tokens") / warm_questions,
        "warm computed tok/q": total(warm, "computed_tokens") / warm_questions,
        "warm generated tok/q": total(warm, "generated_tokens") / warm_questions,
        "warm s/q": total(warm, "seconds") / warm_questions,
        "drafts accepted": f"{total(warm, 'accepted_tokens')}/{total(warm, 'drafted_tokens')}",
    }


def print_table(results: list[dict], questions: int) -> None:
    keys = list(summary(results[0], questions))
    print("| setting | adapter | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for result in results:
        values = summary(result, questions)
        cells = [value if isinstance(value, str) else f"{value:.2f}" for value in values.values()]
        print(f"| {result['setting']} | {result['adapter']} | " + " | ".join(cells) + " |")
    steps = sorted({r["step"] for r in results[0]["calls"]})
    print("\nper step, warm calls (computed prompt tokens / generated tokens / seconds per call):")
    for result in results:
        parts = []
        for step in steps:
            rows = [r for r in result["calls"] if r["step"] == step and r["question"] > 0] or [r for r in result["calls"] if r["step"] == step]
            n = len(rows)
            parts.append(f"{step} {sum(r['computed_tokens'] for r in rows) / n:.0f}/{sum(r['generated_tokens'] for r in rows) / n:.0f}/"
                         f"{sum(r['seconds'] for r in rows) / n:.1f}s")
        print(f"  {result['setting']}: " + "; ".join(parts))


def main(argv: list[str] | None = None) -> int:
    from pipeline.config import ADAPTERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--settings", default="default", help=f"comma-separated, of: {', '.join(SETTINGS)}")
    parser.add_argument("--adapters", default="chat", help=f"comma-separated, of: {', '.join(ADAPTERS)}")
    parser.add_argument("--out", help="write every call's figures to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_setting(args.child, args.questions, args.adapters)))
        return 0
    names, adapters = ([part.strip() for part in text.split(",") if part.strip()] for text in (args.settings, args.adapters))
    for given, known, what in ((names, SETTINGS, "setting"), (adapters, ADAPTERS, "adapter")):
        if unknown := [name for name in given if name not in known]:
            parser.error(f"unknown {what} {unknown[0]!r}; known: {', '.join(known)}")
    results = []
    for name in names:
        for adapter in adapters:
            command = [sys.executable, "-m", __spec__.name, "--child", name, "--questions", str(args.questions), "--adapters", adapter]
            output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
            results.append(json.loads(output.strip().splitlines()[-1]))
            print(f"{name}, {adapter}: done (server start {results[-1]['load_seconds']:.1f} s)", file=sys.stderr)
    print_table(results, args.questions)
    first = [answer_text(call["answer"]) for call in results[0]["calls"]]
    for result in results[1:]:
        same = sum(answer_text(call["answer"]) == text for call, text in zip(result["calls"], first))
        print(f"{result['setting']}, {result['adapter']}: {same} of {len(first)} replies say what the first row's say")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
