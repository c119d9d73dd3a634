"""The `vllm` backend without a GPU: against a fake of exactly the part of vLLM's API it uses
(`vllm_backend.USED_API`), plus a check that a real vllm has those names and arguments, read
from its source files (importing the CUDA wheel needs a CUDA torch, which this environment does
not have, so the check parses the installed package instead of importing it)."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from codeq.config import PolicyConfig
from codeq.errors import ConfigError
from codeq.policy import GenerationRequest, load_policy
from codeq.policy.samples import sample_seed
from codeq.policy.vllm_backend import USED_API, USED_PARAMETERS, VllmPolicy
from codeq.schemas import ChatMessage

# ------------------------------------------------------------------ the fake


def fields_of(name: str) -> tuple[str, ...]:
    return USED_API[name]


def keyword_struct(name: str) -> type:
    """A class that takes exactly the keyword arguments the backend may use."""
    allowed = set(fields_of(name))

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - allowed
        if unknown:
            raise TypeError(f"{name} got arguments the backend should not use: {unknown}")
        self.__dict__.update(kwargs)

    return type(name.rsplit(".", 1)[-1], (), {"__init__": __init__})


@dataclass
class CompletionOutput:
    token_ids: list[int]


@dataclass
class RequestOutput:
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int | None


@dataclass
class FakeRequest:
    prompt: list[int]
    params: Any
    lora: Any
    answer: list[int]
    emitted: list[int] = field(default_factory=list)


class FakeEngine:
    """Emits, one token a step and request, the answer `FakeEngine.answer(prompt, params)`
    gives, ending at a stop token or max_tokens; prefix caching counts prompt tokens seen
    before in blocks of 16."""

    answer: Any = None
    made: list[FakeEngine] = []

    def __init__(self, engine_args: Any) -> None:
        self.engine_args = engine_args
        self.requests: dict[str, FakeRequest] = {}
        self.aborted: list[str] = []
        self.resets = 0
        self.seen: list[list[int]] = []

    @classmethod
    def from_engine_args(cls, engine_args: Any) -> FakeEngine:
        engine = cls(engine_args)
        cls.made.append(engine)
        return engine

    def add_request(self, request_id: str, prompt: Any, params: Any, lora_request=None) -> str:
        ids = prompt["prompt_token_ids"]
        answer = type(self).answer(ids, params)
        self.requests[request_id] = FakeRequest(ids, params, lora_request, answer)
        return request_id

    def cached_tokens(self, prompt: list[int]) -> int:
        if not self.engine_args.enable_prefix_caching:
            return 0
        best = 0
        for earlier in self.seen:
            same = next(
                (i for i, (a, b) in enumerate(zip(earlier, prompt, strict=False)) if a != b),
                min(len(earlier), len(prompt)),
            )
            best = max(best, same)
        return min(best, len(prompt) - 1) // 16 * 16

    def step(self) -> list[RequestOutput]:
        outputs = []
        for request_id, request in list(self.requests.items()):
            cached = None
            if not request.emitted:
                cached = self.cached_tokens(request.prompt)
                self.seen.append(request.prompt)
            request.emitted.append(request.answer[len(request.emitted)])
            params = request.params
            finished = (
                request.emitted[-1] in params.stop_token_ids
                or len(request.emitted) >= params.max_tokens
            )
            outputs.append(
                RequestOutput(
                    request_id, [CompletionOutput(list(request.emitted))], finished, cached
                )
            )
            if finished:
                del self.requests[request_id]
        return outputs

    def abort_request(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.aborted.append(request_id)
            self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        self.seen.clear()
        return True


def fake_vllm_modules() -> dict[str, types.ModuleType]:
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    vllm.EngineArgs = keyword_struct("vllm.EngineArgs")
    vllm.SamplingParams = keyword_struct("vllm.SamplingParams")
    vllm.LLMEngine = FakeEngine
    vllm.TokensPrompt = lambda **kwargs: dict(kwargs)
    vllm.RequestOutput, vllm.CompletionOutput = RequestOutput, CompletionOutput
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = keyword_struct("vllm.lora.request.LoRARequest")
    lora.request = request
    vllm.lora = lora
    return {"vllm": vllm, "vllm.lora": lora, "vllm.lora.request": request}


@pytest.fixture
def fake_vllm(monkeypatch):
    """The fake installed as `vllm`, and a CUDA GPU claimed."""
    import torch

    for name, module in fake_vllm_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    FakeEngine.made = []
    return FakeEngine


def text_answer(tokenizer: Any, template: str) -> Any:
    """Answers: `template` formatted with the sample's seed (or 'greedy'), then more words,
    so a stop rule must cut them off."""

    def answer(prompt: list[int], params: Any) -> list[int]:
        text = template.format(seed=params.seed if params.seed is not None else "greedy")
        ids = tokenizer(text + " and then some more words that go on", add_special_tokens=False)
        return ids["input_ids"] + [tokenizer.eos_token_id]

    return answer


def messages(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


@pytest.fixture
def policy(fake_vllm, tiny_model_dir) -> VllmPolicy:
    config = PolicyConfig(model=str(tiny_model_dir), backend="vllm", batch_size=8)
    chosen = load_policy(config, seed=3)
    assert isinstance(chosen, VllmPolicy)
    return chosen


# ------------------------------------------------------------------ against the fake


def test_every_sample_is_a_request_with_its_own_seed_and_our_settings(policy, fake_vllm):
    fake_vllm.answer = text_answer(policy.tokenizer, "Answer {seed}.")
    request = GenerationRequest(
        messages("Fix it."),
        n=3,
        temperature=0.7,
        top_p=0.9,
        max_new_tokens=40,
        seed=21,
        stop="none",
    )
    [result] = policy.generate([request])
    engine = fake_vllm.made[0]
    assert [text.split(".")[0] for text in result.texts] == [
        f"Answer {sample_seed(21, k)}" for k in range(3)
    ]
    prompt = policy.encode_chat(request.messages)
    assert result.prompt_tokens == len(prompt)
    assert all(ids[-1] in policy.eos_ids for ids in result.token_ids)
    assert result.completion_tokens == [len(ids) for ids in result.token_ids]
    again = policy.generate([request])[0]
    assert again.texts == result.texts  # the seeds do not depend on what ran before
    unseeded = GenerationRequest(messages("Fix it."), n=2, temperature=0.0, stop="none")
    assert [t.split(".")[0] for t in policy.generate([unseeded])[0].texts] == ["Answer greedy"] * 2
    params = engine.engine_args
    assert params.enable_prefix_caching and params.max_num_seqs == 8 and params.seed == 3


def test_sampling_params_carry_temperature_top_p_budget_and_stop_ids(policy, fake_vllm):
    seen = []

    def answer(prompt, params):
        seen.append(params)
        return [policy.tokenizer.eos_token_id]

    fake_vllm.answer = answer
    policy.generate(
        [
            GenerationRequest(
                messages("x"), n=2, temperature=0.2, top_p=0.5, max_new_tokens=17, seed=4
            )
        ]
    )
    assert [p.seed for p in seen] == [sample_seed(4, 0), sample_seed(4, 1)]
    for p in seen:
        assert (p.n, p.temperature, p.top_p, p.max_tokens) == (1, 0.2, 0.5, 17)
        assert sorted(p.stop_token_ids) == sorted(policy.eos_ids) and p.detokenize is False


@pytest.mark.parametrize(
    ("kind", "template", "expected"),
    [
        (
            "code",
            "Fixed:\n```python\nx = {seed}\n```\nThis works",
            "Fixed:\n```python\nx = greedy\n```",
        ),
        ("score", "Looks right. Score: 8/10\nMore text", "Looks right. Score: 8/10\n"),
    ],
)
def test_our_stop_rules_abort_the_request_and_cut_the_text(
    policy, fake_vllm, kind, template, expected
):
    fake_vllm.answer = text_answer(policy.tokenizer, template)
    request = GenerationRequest(messages("Fix it."), temperature=0.0, max_new_tokens=60, stop=kind)
    [result] = policy.generate([request])
    engine = fake_vllm.made[0]
    assert engine.aborted, "the request must be aborted once the rule fires"
    assert result.texts == [expected]
    full = fake_vllm.answer([], types.SimpleNamespace(seed=None))
    count = result.completion_tokens[0]
    assert count < len(full) and result.token_ids[0] == full[:count]
    assert not engine.requests  # nothing left running


def test_a_stream_serves_requests_as_they_come_and_counts_reuse(policy, fake_vllm):
    fake_vllm.answer = text_answer(policy.tokenizer, "Answer {seed}.")
    long = "Explain this program in detail. " * 20
    stream = policy.stream()
    first = stream.submit(GenerationRequest(messages(long), temperature=0.0, stop="none"))
    results = dict(stream.step())
    second = stream.submit(
        GenerationRequest(messages(long + " Again."), n=2, temperature=0.0, stop="none")
    )
    while stream.busy:
        results.update(stream.step())
    assert set(results) == {first, second} and len(results[second].texts) == 2
    stats = policy.stats
    assert stats.prompt_tokens == results[first].prompt_tokens + results[second].prompt_tokens
    assert stats.prefilled_tokens < stats.prompt_tokens + results[second].prompt_tokens  # reused
    policy.clear_prefix_cache()
    assert fake_vllm.made[0].resets == 1


def test_quantization_dtype_lengths_and_lora_reach_vllm(fake_vllm, tiny_model_dir, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 32}')
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    for quantization, expected in (
        ("auto", "bitsandbytes"),
        ("nf4", "bitsandbytes"),
        ("fp8", "fp8"),
        ("none", None),
    ):
        config = PolicyConfig(
            model=str(tiny_model_dir),
            backend="vllm",
            quantization=quantization,
            max_prompt_tokens=1000,
            max_new_tokens=200,
            prefix_cache_tokens=0,
            adapter=str(adapter),
        )
        try:
            load_policy(config)
        except ConfigError as exc:  # the adapter check may want more files
            pytest.fail(str(exc))
        args = fake_vllm.made[-1].engine_args
        assert args.quantization == expected and args.dtype == "bfloat16"
        assert args.max_model_len == 1200 and args.enable_prefix_caching is False
        assert args.enable_lora is True and args.max_lora_rank == 32


def test_the_fake_has_exactly_the_engine_methods_the_backend_uses():
    public = {name for name in vars(FakeEngine) if not name.startswith("_")} - {
        "answer",
        "made",
        "cached_tokens",
    }
    assert public == set(USED_API["vllm.LLMEngine"])


# ------------------------------------------------------------------ against vllm's source


def vllm_source() -> Path | None:
    """The installed vllm package's folder (found, not imported), else CODEQ_VLLM_SOURCE (a
    folder holding vllm/, e.g. an unpacked sdist or wheel)."""
    spec = importlib.util.find_spec("vllm") if "vllm" not in sys.modules else None
    if spec is not None and spec.origin:
        return Path(spec.origin).parent.parent
    folder = os.environ.get("CODEQ_VLLM_SOURCE")
    return Path(folder) if folder else None


class Source:
    """vllm's modules parsed, names resolved through imports and aliases."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def tree(self, module: str) -> ast.Module:
        base = self.root.joinpath(*module.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        return ast.parse(path.read_text(encoding="utf-8"))

    def lazy_attrs(self) -> dict[str, str]:
        for node in self.tree("vllm").body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in node.targets
            ):
                return ast.literal_eval(node.value)
        return {}

    def find_class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef]:
        assert depth < 6, f"cannot resolve {module}.{name}"
        for node in self.tree(module).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
            aliased = isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
            if aliased and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return self.find_class(module, node.value.id, depth + 1)
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.find_class(self.absolute(module, node), alias.name, depth + 1)
        raise AssertionError(f"{name} is not defined in {module}")

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.root.joinpath(*module.split("."))
        package = module.split(".") if base.is_dir() else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        return ".".join(package + ([node.module] if node.module else []))

    def resolve(self, dotted: str) -> tuple[str, ast.ClassDef]:
        parts = dotted.split(".")
        if len(parts) == 2:  # a top-level name: vllm's lazy MODULE_ATTRS
            module, _, attr = self.lazy_attrs()[parts[1]].partition(":")
            return self.find_class("vllm" + module, attr)
        return self.find_class(".".join(parts[:-1]), parts[-1])

    def members(self, dotted: str) -> set[str]:
        module, cls = self.resolve(dotted)
        return self.class_members(module, cls, 0)

    def class_members(self, module: str, cls: ast.ClassDef, depth: int) -> set[str]:
        found: set[str] = set()
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.add(node.name)
                if node.name == "__init__":
                    found |= {a.arg for a in node.args.args + node.args.kwonlyargs}
                    found |= {
                        sub.attr
                        for sub in ast.walk(node)
                        if isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"
                        and isinstance(sub.ctx, ast.Store)
                    }
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
        for base in cls.bases:
            if depth < 3 and isinstance(base, ast.Name):
                with_base = self.try_class(module, base.id)
                if with_base is not None:
                    found |= self.class_members(*with_base, depth + 1)
        return found

    def try_class(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        try:
            return self.find_class(module, name)
        except (AssertionError, OSError):
            return None

    def method(self, dotted: str) -> ast.FunctionDef:
        owner, name = dotted.rsplit(".", 1)
        _, cls = self.resolve(owner)
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        raise AssertionError(f"{owner} has no method {name}")


@pytest.fixture(scope="module")
def source() -> Source:
    root = vllm_source()
    if root is None or not (root / "vllm" / "__init__.py").is_file():
        pytest.skip("no vllm installed and CODEQ_VLLM_SOURCE not set")
    return Source(root)


def test_vllm_has_every_name_and_argument_the_backend_uses(source):
    from codeq.policy.vllm_backend import VLLM_VERSION

    missing = {name: sorted(set(used) - source.members(name)) for name, used in USED_API.items()}
    assert not any(missing.values()), missing
    for dotted, (positional, keywords) in USED_PARAMETERS.items():
        arguments = source.method(dotted).args
        names = [a.arg for a in arguments.posonlyargs + arguments.args][1:]  # self / cls
        assert names[: len(positional)] == list(positional), (dotted, names)
        assert set(keywords) <= set(names) | {a.arg for a in arguments.kwonlyargs}, dotted
    extra = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert f'"vllm=={VLLM_VERSION}"' in extra  # the release the extra installs
