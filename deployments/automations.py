"""Server-side automation: mark "zombie" flow runs Crashed.

A flow-run process that dies without reporting (SIGKILL, OOM killer, a lost machine)
leaves its run `Running` in the UI forever: nothing is left to report the end. Prefect's
answer is heartbeats plus an automation: flow runs started with
PREFECT_FLOWS_HEARTBEAT_FREQUENCY=N (N >= 30) emit a `prefect.flow-run.heartbeat` event
every N seconds, and this automation marks a run Crashed when, after a heartbeat, neither
another heartbeat nor a final state arrives within `within` seconds. A crashed encode is
then safe to rerun: finished shards come back Cached (see docs/operations.md).

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.automations --within 90

Idempotent: an automation of the same name is replaced. Set the heartbeat on whatever
starts flow runs: the worker's or `tokenmill serve`'s environment
(PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30), or a deployment's job_variables.env.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

NAME = "tokenmill: crash zombie flow runs"


def zombie_automation(within: float = 90.0):
    """The automation object (not yet saved)."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=NAME,
        description="Mark a flow run Crashed when its heartbeats stop without a final state.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=f"No heartbeat for {within:.0f} s: the flow-run process is gone (marked by {NAME!r}).")],
    )


def install(within: float = 90.0):
    """Create (or replace) the automation on the server PREFECT_API_URL points at."""
    from prefect.automations import Automation

    try:
        Automation.read(name=NAME).delete()
    except ValueError:  # none yet
        pass
    return zombie_automation(within).create()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployments.automations", description=__doc__.split("\n\n")[0])
    p.add_argument("--within", type=float, default=90.0, help="seconds without a heartbeat before a run counts as crashed (default 90; >= 2x the heartbeat)")
    args = p.parse_args(argv)
    automation = install(args.within)
    print(f"automation {automation.name!r} ({automation.id}): runs without a heartbeat for {args.within:.0f} s become Crashed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
