"""What LM fact extraction costs: passages per minute, and per passage the LM calls, prompt
tokens (and those served from the server's prompt cache) and generated tokens.

    python -m experiments.bench.extract --extractor lm-entities --first 6
    python -m experiments.bench.extract --extractor lm --first 100 --corpus ../shared/data/musique/corpus.json
    python -m experiments.bench.extract --extractor lm --first 6 --lm-threads 4   # 4 requests in flight, 4 server slots

The first N passages of the corpus are extracted with nothing cached: the extraction cache and
DSPy's cache live in a fresh temporary folder, so every passage is a real LM call (a retry after
a malformed answer counts too). On the embedded model unless `--lm` names another; with
`--lm-threads K` K passages are in flight at once, which is what an API endpoint serves in
parallel (the embedded server then runs K slots on the same cores). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from modules.errors import HyperProveError
from pipeline.config import ADAPTERS, EXTRACTORS, HyperProveConfig
from pipeline.index.corpus import load_corpus
from pipeline.index.extract import LM_EXTRACTORS, make_extractor
from pipeline.runtime import Runtime

MUSIQUE = ROOT.parent / "shared" / "data" / "musique" / "corpus.json"


def measure_extraction(corpus: str, first: int, extractor: str, lm: dict, model=None) -> dict:
    """Extract the first `first` passages of `corpus` with nothing cached; the figures of one run.
    `model` is an LM object to use instead of the configured one (a test's scripted LM)."""
    from pipeline.lm.profile import profile_delta

    if extractor not in LM_EXTRACTORS:
        raise HyperProveError(f"--extractor {extractor!r}: only the LM extractors ({', '.join(LM_EXTRACTORS)}) call an LM")
    passages = load_corpus(corpus)[:first]
    if not passages:
        raise HyperProveError(f"{corpus}: no passages")
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as cache:
        config = HyperProveConfig().with_overrides(lm=lm, cache_dir=cache)
        session = Runtime(config, lm=model).session  # starts the server before the clock does
        extract = make_extractor(extractor, session.lm, session.id, cache, config.lm.concurrency)
        before, started = session.profile.snapshot(), time.perf_counter()
        facts = extract.extract(passages, progress=True)
        seconds = time.perf_counter() - started
        spent = profile_delta(session.profile.snapshot(), before)
    total = {key: sum(asdict(cost)[key] for cost in spent.values()) for key in ("calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens")}
    report = extract.report()
    n = len(passages)
    return {
        "extractor": extractor, "lm": session.id, "adapter": session.adapter, "threads": config.lm.concurrency, "passages": n,
        "characters_per_passage": round(sum(len(p.text) for p in passages) / n), "seconds": round(seconds, 1),
        "passages_per_minute": round(60 * n / seconds, 2), "facts_per_passage": round(sum(map(len, facts)) / n, 2),
        "entities_per_fact": round(sum(len(f.entities) for fs in facts for f in fs) / max(1, sum(map(len, facts))), 2),
        "lm_calls_per_passage": round(total["calls"] / n, 2), "prompt_tokens_per_passage": round(total["prompt_tokens"] / n, 1),
        "cached_prompt_tokens_per_passage": round(total["cached_prompt_tokens"] / n, 1),
        "generated_tokens_per_passage": round(total["completion_tokens"] / n, 1),
        "retried": report["retried"], "fallbacks": report["fallbacks"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extractor", choices=[name for name in EXTRACTORS if name != "sentences"], default="lm")
    parser.add_argument("--corpus", default=str(MUSIQUE), help="a corpus file (default: MuSiQue's)")
    parser.add_argument("--first", type=int, default=6, help="how many passages, from the start of the corpus")
    parser.add_argument("--lm", help="a LiteLLM model id (default: the embedded local model)")
    parser.add_argument("--lm-threads", type=int, help="passages in flight at once (default: 1 for the local model)")
    parser.add_argument("--lm-adapter", choices=list(ADAPTERS), help="how prompts are laid out (default: lean-prefilled on the embedded model, chat on an API model)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args(argv)
    try:
        figures = measure_extraction(args.corpus, args.first, args.extractor, {"model": args.lm, "threads": args.lm_threads, "adapter": args.lm_adapter})
    except HyperProveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{figures['extractor']} ({figures['adapter']} adapter) on {figures['passages']} passages ({figures['characters_per_passage']} characters each), "
              f"{figures['threads']} in flight: {figures['passages_per_minute']} passages a minute ({figures['seconds']} s); per passage "
              f"{figures['lm_calls_per_passage']} LM calls, {figures['prompt_tokens_per_passage']} prompt tokens "
              f"({figures['cached_prompt_tokens_per_passage']} from the prompt cache), {figures['generated_tokens_per_passage']} generated, "
              f"{figures['facts_per_passage']} facts of {figures['entities_per_fact']} entities; "
              f"{figures['retried']} retried, {figures['fallbacks']} fell back to sentences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
