"""The simulator's parts: the cost model against its cited calibration points and its own
closed forms, profiles (built-in and from files), routers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.simulate import router as routers
from controlplane.simulate.cost import CostModel
from controlplane.simulate.engine import SimOptions, simulate
from controlplane.simulate.profiles import BUILTIN, Profile, ProfileError, load_profile
from controlplane.traces.model import Trace

H200_8B = CostModel(BUILTIN["llama3-8b-h200"])


def test_8b_h200_matches_vllms_latency_benchmark() -> None:
    # vLLM's CI latency test on one H200: 8 prompts of 32 tokens, 128 output tokens
    # each, 833.4 ms mean end to end (docs/simulate.md, "Profiles").
    prefill = H200_8B.step_seconds(256, 8 * H200_8B.chunk_pairs(32, 0), 256)
    total = prefill + H200_8B.decode_seconds(8, 8 * 33, 127)
    assert total == pytest.approx(0.8334, rel=0.02)


def test_70b_fp8_matches_nims_two_h100_measurement() -> None:
    # NIM, Llama-3.3-70B fp8 on 2 x H100 (TP2), 5000 input tokens, concurrency 1:
    # TTFT 406.77 ms, ITL 18.58 ms. Same efficiencies as the built-ins, two GPUs' peaks.
    two_h100 = BUILTIN["llama3-70b-fp8-h200"].model_copy(
        update={"name": "2xh100", "peak_tflops": 2 * 1979.0, "hbm_tb_s": 6.7, "hbm_gb": 160.0}
    )
    cost = CostModel(two_h100)
    assert cost.prefill_seconds(5000, 0) == pytest.approx(0.40677, rel=0.02)
    assert cost.decode_seconds(1, 5001, 1) == pytest.approx(0.01858, rel=0.02)


def test_prefill_grows_with_uncached_tokens_and_their_context() -> None:
    base = H200_8B.prefill_seconds(2000, 0)
    assert H200_8B.prefill_seconds(4000, 0) > 2 * base * 0.99
    assert H200_8B.prefill_seconds(2000, 30_000) > base * 1.2  # attention over context


@given(
    running=st.integers(1, 1024),
    context=st.integers(0, 2_000_000),
    steps=st.integers(1, 400),
)
def test_decode_closed_form_is_the_sum_of_its_steps(running: int, context: int, steps: int) -> None:
    each = [
        H200_8B.step_seconds(running, context + running * i, context + running * i)
        for i in range(steps)
    ]
    assert H200_8B.decode_seconds(running, context, steps) == pytest.approx(sum(each))
    within = H200_8B.decode_steps_within(running, context, sum(each[: steps // 2]) + 1e-12)
    assert within == steps // 2


def test_profiles_load_from_json_and_toml(tmp_path: Path) -> None:
    fields = BUILTIN["llama3-8b-h100"].model_dump()
    fields["name"] = "mine"
    (tmp_path / "p.json").write_text(json.dumps(fields))
    toml = "\n".join(
        f"{k} = {json.dumps(v)}" for k, v in fields.items()
    )  # JSON scalars are TOML scalars
    (tmp_path / "p.toml").write_text(toml)
    for name in ("p.json", "p.toml"):
        got = load_profile(str(tmp_path / name))
        assert got == Profile.model_validate(fields)
    assert load_profile("llama3-70b-fp8-h200") is BUILTIN["llama3-70b-fp8-h200"]


def test_bad_profiles_say_what_and_where(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="built-in profiles: llama3-8b-h200"):
        load_profile("gpt-9")
    fields = BUILTIN["llama3-8b-h100"].model_dump()
    fields["prefill_mfu"] = 1.5
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(fields))
    with pytest.raises(ProfileError, match=r"bad\.json: field 'prefill_mfu'"):
        load_profile(str(path))
    fields = BUILTIN["llama3-8b-h100"].model_dump() | {"hbm_gb": 10.0}
    path.write_text(json.dumps(fields))
    with pytest.raises(ProfileError) as refused:
        load_profile(str(path))
    assert str(refused.value) == (  # a check across fields: they are named in the reason
        f"{path}: the weights (16.1 GB: params_billion x weight_bytes) leave no KV cache in "
        "90% (memory_utilization) of 10.0 GB (hbm_gb)"
    )
    with pytest.raises(ProfileError) as refused:
        load_profile(str(tmp_path / "missing.toml"))
    assert str(refused.value) == f"{tmp_path / 'missing.toml'}: No such file or directory"
    path.write_text("[1, 2]")
    with pytest.raises(ProfileError, match="expected an object"):
        load_profile(str(path))
    # A field a profile does not have was "Extra inputs are not permitted": pydantic's words.
    path.write_text(json.dumps(BUILTIN["llama3-8b-h100"].model_dump() | {"gpus": 2}))
    with pytest.raises(ProfileError) as refused:
        load_profile(str(path))
    assert str(refused.value).startswith(
        f"{path}: field 'gpus': not a profile field (the fields: name, description, "
    )


def test_profile_sizes() -> None:
    p = BUILTIN["llama3-8b-h200"]
    assert p.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert p.kv_pool_blocks(16) == int((141 * 0.9 - 16.06) * 1e9 // (131072 * 16))
    assert p.blocks_for_gib(2.0, 16) == 1024


def conversations() -> Trace:
    # Two conversations of three turns each, interleaved; turn k extends turn k-1.
    reqs, chats, parents = [], [], []
    for turn in range(3):
        for conv in range(2):
            base = 1000 * (conv + 1)
            reqs.append([base + i for i in range(4 * (turn + 1))])
            chats.append(10 * conv + turn)
            parents.append(10 * conv + turn - 1 if turn else -1)
    n = len(reqs)
    return Trace.from_arrays(
        name="conv",
        source_format="bailian",
        hash_ids=np.array([b for r in reqs for b in r], dtype=np.int64),
        lengths=np.array([len(r) for r in reqs], dtype=np.int64),
        timestamps=np.arange(n, dtype=np.float64) * 30.0,
        types=["text"] * n,
        turns=np.array([1 + i // 2 for i in range(n)], dtype=np.int64),
        chat_ids=np.array(chats, dtype=np.int64),
        parent_chat_ids=np.array(parents, dtype=np.int64),
    )


@pytest.mark.parametrize("router", ["session", "prefix"])
def test_affinity_routers_keep_a_conversation_on_one_instance(router: str) -> None:
    trace = conversations()
    _, out = simulate(trace, "lru", 10_000, SimOptions(instances=3, router=router))
    homes = out.instance.tolist()
    assert homes[0::2] == [homes[0]] * 3 and homes[1::2] == [homes[1]] * 3
    assert out.hit_blocks.sum() == 2 * (4 + 8)  # every later turn hits its whole history


def test_round_robin_spreads_and_loses_the_history() -> None:
    trace = conversations()
    _, out = simulate(trace, "lru", 10_000, SimOptions(instances=3, router="round-robin"))
    assert out.instance.tolist() == [0, 1, 2, 0, 1, 2]
    assert out.hit_blocks.sum() < 2 * (4 + 8)


def test_least_loaded_and_session_keys() -> None:
    class Loads:
        def __init__(self, loads: list[int]) -> None:
            self._loads = loads

        def loads(self) -> list[int]:
            return self._loads

        def matched(self, instance: int, request: int) -> int:
            return 0

    trace = conversations()
    assert routers.create("least-loaded", trace, Loads([3, 1, 1]), 3).route(0) == 1
    assert routers.session_keys(trace) == [0, 10, 0, 10, 0, 10]
    anonymous = Trace.from_requests([[5, 6], [5, 7], [8]])
    assert routers.session_keys(anonymous) == [-1, -1, -4]  # dense ids 0, 0, 3
    with pytest.raises(routers.UnknownRouterError, match="known routers: round-robin"):
        SimOptions(router="random")


@pytest.mark.parametrize("field", ["hbm_gb", "step_overhead_ms", "peak_tflops", "hbm_tb_s"])
def test_a_profile_with_an_infinite_number_is_refused_naming_file_and_field(
    tmp_path: Path, field: str
) -> None:
    """TOML's ``inf`` (JSON's ``Infinity``) passed every bound: an infinite HBM made the
    default capacity ``int(nan)`` (a traceback), an infinite step overhead NaN TTFTs."""
    fields = BUILTIN["llama3-8b-h100"].model_dump()
    path = tmp_path / "inf.toml"
    path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items() if k != field))
    path.write_text(path.read_text() + f"\n{field} = inf\n")
    with pytest.raises(ProfileError, match=rf"inf\.toml: field '{field}': .*finite"):
        load_profile(str(path))


@pytest.mark.parametrize(
    ("update", "message"),
    [
        # each number valid, the step infinite: --json printed Infinity
        ({"peak_tflops": 1e-300}, r"overflow a float: compute per token \(params_billion"),
        ({"params_billion": 1e300, "hbm_gb": 1e300}, r"weight reads \(params_billion, weight"),
        ({"kv_bytes": 1e300}, r"KV reads \(layers, kv_heads, head_dim, kv_bytes"),
        # a step of 0 s: NaN from the decode closed form, a traceback
        ({"peak_tflops": 1e300, "hbm_tb_s": 1e300, "step_overhead_ms": 0}, "take no time"),
    ],
)
def test_a_profile_whose_steps_are_not_finite_is_refused(
    update: dict[str, float], message: str
) -> None:
    with pytest.raises(ProfileError, match=message):
        CostModel(BUILTIN["llama3-8b-h100"].model_copy(update=update))
