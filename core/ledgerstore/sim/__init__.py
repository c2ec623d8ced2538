"""Deterministic simulation of a whole cluster (``ledgerstore sim``).

The real bookie and client code runs in one process on one event loop whose clock is virtual
(:mod:`.loop`), over a simulated network (:mod:`.network`), metadata store (:mod:`.metadata`) and
disks (:mod:`.disk`). One seed decides every choice, so a run replays exactly; its event trace has
a hash to prove it. :func:`run_seed` runs one schedule and checks the protocol's invariants.
"""

from ledgerstore.sim.faults import FAULT_KINDS, SCENARIOS
from ledgerstore.sim.loop import SimulationStuck, VirtualTimeLoop
from ledgerstore.sim.runner import PARTS, Outcome, Shape, Shrunk, run_seed, shrink

__all__ = ["FAULT_KINDS", "PARTS", "SCENARIOS", "Outcome", "Shape", "Shrunk", "SimulationStuck", "VirtualTimeLoop",
           "run_seed", "shrink"]
