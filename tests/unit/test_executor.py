"""From a planned Schedule to the engine's llama.cpp settings."""

from pathlib import Path

from sidecar.budget import Budget
from sidecar.local.executor import config_from_schedule, cpu_engine_config, engine_config, load_plan_inputs
from sidecar.model_info import inspect_gguf
from sidecar.planner import PlanOptions, cpu_only_box, desktop_16gb_pcie5x16, plan
from sidecar.settings import Settings


def test_a_cpu_schedule_sets_threads_per_tier_and_the_micro_batch(smollm2_path: Path) -> None:
    settings = Settings(model=smollm2_path)
    schedule = plan(inspect_gguf(smollm2_path), cpu_only_box(), Budget(0, 3), ctx=4096, options=PlanOptions(n_batch=512))
    config = config_from_schedule(cpu_engine_config(settings, Budget(0, 3)), schedule)
    assert dict(config.tier_threads) == {t.max_tokens: t.threads for t in schedule.tiers}
    assert all(threads <= 3 for _, threads in config.tier_threads), "the game's thread cap binds"
    assert config.n_ubatch == min(schedule.micro_batch, 512)
    assert config.n_gpu_layers == 0 and config.tensor_overrides == ()


def test_gpu_placement_is_dropped_when_llama_cpp_sees_no_gpu(smollm2_path: Path) -> None:
    # Planned for a desktop with a GPU, run here (a CPU-only llama.cpp build): nothing may ask
    # llama.cpp for a device it does not have.
    schedule = plan(inspect_gguf(smollm2_path), desktop_16gb_pcie5x16(), Budget(1 << 30, 0), ctx=4096)
    assert schedule.n_gpu_layers > 0 or schedule.tensor_overrides
    config = config_from_schedule(cpu_engine_config(Settings(model=smollm2_path), Budget(1 << 30, 0)), schedule)
    assert config.n_gpu_layers == 0 and config.tensor_overrides == ()


def test_an_explicit_thread_flag_caps_every_tier(smollm2_path: Path) -> None:
    schedule = plan(inspect_gguf(smollm2_path), cpu_only_box(), Budget(0, 0), ctx=4096)
    config = config_from_schedule(cpu_engine_config(Settings(model=smollm2_path), Budget(0, 0)), schedule, threads_flag=1)
    assert {t for _, t in config.tier_threads} == {1}


def test_planning_off_gives_the_cpu_plan(smollm2_path: Path) -> None:
    settings = Settings(model=smollm2_path, profile="off", threads=2)
    assert load_plan_inputs(settings) is None
    assert engine_config(settings).tier_threads == ((1, 2), (512, 2))
