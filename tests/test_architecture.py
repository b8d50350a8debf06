"""The library's shape (docs/guides/architecture.md): imports run downward; one phase owner drives every exchange."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "architecture.py"
REGISTRATIONS = {"gpflow_fed.covariances", "gpflow_fed.inducing_variables", "gpflow_fed.posteriors"}


def _architecture():
    spec = importlib.util.spec_from_file_location("architecture", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_only_import_cycle_is_gpflows_registration_idiom():
    module_cycles, package_cycles = _architecture().cycles()
    for cycle in module_cycles:  # Kuu/Kuf and posterior registrations imported with the types they serve
        assert {m.rsplit(".", 1)[0] if m.count(".") > 1 else m for m in cycle} <= REGISTRATIONS, cycle
    assert package_cycles in ([], [sorted(REGISTRATIONS)]), package_cycles


def test_no_module_calls_back_into_the_phase_owner_and_every_stage_goes_through_the_transport():
    trace = _architecture().trace()
    assert trace["reentered_from_below"] == {}
    stages = trace["from_phase_owner"]
    assert set(stages) == {"update", "advertise", "share", "store", "masked_input", "unmask"}
    for stage, modules in stages.items():
        assert "gpflow_fed.federated.runtimes.local" in modules, stage  # the transport carries every stage
    assert modules_entered_once(stages["update"], ("gpflow_fed.federated.protocol.faults",))


def modules_entered_once(modules, names):
    """Screening (``faults.screen``) runs once per phase: one round of one phase plus the final phase."""
    return all(modules.get(name, 0) <= 2 for name in names)
