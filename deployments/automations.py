"""Server-side automations: mark "zombie" flow runs Crashed; notify when a run fails.

A flow-run process that dies without reporting (SIGKILL, OOM killer, a lost machine)
leaves its run `Running` in the UI forever: nothing is left to report the end. Prefect's
answer is heartbeats plus an automation: a flow run emits a `prefect.flow-run.heartbeat`
event every PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds (Prefect's default: 180), and this
automation marks a run Crashed when, after a heartbeat, neither another heartbeat nor a
final state arrives within `within` seconds. A crashed encode is then safe to rerun:
finished shards come back Cached (see docs/operations.md).

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.automations

Scoped to tokenmill's own flow runs (flows named `tokenmill-*`): a shared server's other
flows, whose heartbeats may be Prefect's 180 s, are never touched. tokenmill's runs send a
heartbeat every HEARTBEAT_S seconds (the deployments' job_variables.env, `tokenmill serve`
and `tokenmill run` against a server set PREFECT_FLOWS_HEARTBEAT_FREQUENCY, unless it is
already set), and the window (`--within`, default WITHIN_S) is several heartbeats long, so
a heartbeat late on a loaded machine does not crash a healthy run. `--within` below
MIN_HEARTBEATS x the heartbeat is refused. Idempotent: an automation of the same name is
replaced.

The second automation sends a notification through a notification block you name
(`custom-webhook/NAME`, `slack-webhook/NAME`, ...; create it in the UI under Blocks or with
`CustomWebhookNotificationBlock(...).save(NAME)`) whenever a flow run of a tokenmill flow
(`tokenmill-*`) ends Failed or Crashed, including runs the zombie automation marks Crashed:

    python -m deployments.automations --notify custom-webhook/ops-alerts
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import cast

from flows.prefect_api import HEARTBEAT_S  # what tokenmill's flow runs send

NAME = "tokenmill: crash zombie flow runs"
FAILURE_NAME = "tokenmill: notify on failed flow runs"
FLOW_NAMES = "tokenmill-*"  # the flows of flows.pipeline (tokenmill-pipeline, tokenmill-corpus ...)
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
MIN_HEARTBEATS = 3  # the window spans at least this many heartbeats
WITHIN_S = 150.0  # five heartbeats: one or two late ones on a loaded machine are no crash
SUBJECT = "tokenmill: {{ flow.name }} run {{ flow_run.name }} {{ flow_run.state.name }}"
BODY = (
    "Flow run {{ flow_run.name }} of {{ flow.name }}"
    "{% if deployment %} (deployment {{ deployment.name }}){% endif %} ended {{ flow_run.state.name }}: "
    "{{ flow_run.state.message }}\n"
    "store: {{ flow_run.parameters.store }}\n"
    "{{ flow_run|ui_url }}"
)


def heartbeat_env() -> dict[str, str]:
    """The environment that makes a flow run send tokenmill's heartbeats."""
    return {HEARTBEAT_ENV: str(HEARTBEAT_S)}


def check_within(within: float, heartbeat: float = HEARTBEAT_S) -> float:
    """`within`, refused (InputError) when shorter than MIN_HEARTBEATS heartbeats."""
    from pipeline_lib.errors import InputError

    if within < MIN_HEARTBEATS * heartbeat:
        raise InputError(
            f"--within {within:g}: shorter than {MIN_HEARTBEATS} heartbeats of {heartbeat:g} s ({HEARTBEAT_ENV}); "
            f"healthy runs would be marked Crashed: use --within {MIN_HEARTBEATS * heartbeat:g} or more (default "
            f"{WITHIN_S:g})"
        )
    return within


def zombie_automation(within: float = WITHIN_S, flows: str = FLOW_NAMES):
    """The automation object (not yet saved), for the flow runs of flows named `flows`."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=NAME,
        description=f"Mark a flow run of {flows} Crashed when its heartbeats stop for {within:.0f} s without a final "
        "state.",
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
            # the heartbeat and state events of a flow run name its flow as a related resource
            match_related=ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": flows}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        ),
        # name and force are the model's defaults, spelled out: mypy does not read pydantic's Field(None) as a default
        actions=[
            ChangeFlowRunState(
                name=None,
                state=StateType.CRASHED,
                message=f"No heartbeat for {within:.0f} s: the flow-run process is gone (marked by {NAME!r}).",
                force=False,
            )
        ],
    )


def _replace(automation):
    from prefect.automations import Automation

    try:
        # sync here: `async_dispatch` picks by caller
        existing = cast(Automation, Automation.read(name=automation.name))
        existing.delete()
    except ValueError:  # none yet
        pass
    return automation.create()


def install(within: float = WITHIN_S, flows: str = FLOW_NAMES):
    """Create (or replace) the zombie automation on the server PREFECT_API_URL points at.

    Raises:
        InputError: `within` shorter than MIN_HEARTBEATS heartbeats.
    """
    return _replace(zombie_automation(check_within(within), flows))


def failure_automation(block_document_id, flows: str = FLOW_NAMES):
    """The failure-notification automation (not yet saved): a flow run of a flow named
    `flows` (a trailing * matches any suffix) entering Failed or Crashed sends SUBJECT/BODY
    through the notification block `block_document_id`."""
    from prefect.automations import Automation
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=FAILURE_NAME,
        description=f"Notify when a flow run of {flows} ends Failed or Crashed.",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": flows}),
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[SendNotification(block_document_id=block_document_id, subject=SUBJECT, body=BODY)],
    )


def install_failure_notification(block: str, flows: str = FLOW_NAMES):
    """Create (or replace) the failure-notification automation, sending through the
    notification block `block` ("block-type/name", e.g. "custom-webhook/ops-alerts").

    Raises:
        InputError: no such block, or a block that cannot send notifications.
    """
    from deployments.steps import load_block
    from pipeline_lib.errors import InputError

    document = load_block(block, "--notify")
    if "notify" not in (document.block_schema.capabilities if document.block_schema else []):
        raise InputError(
            f"--notify {block!r} is not a notification block: use a custom-webhook, slack-webhook, "
            "ms-teams-webhook ... block (one with the 'notify' capability)"
        )
    return _replace(failure_automation(document.id, flows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployments.automations", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--within",
        type=float,
        default=WITHIN_S,
        help=f"seconds without a heartbeat before a tokenmill run counts as crashed (default {WITHIN_S:g}; >= "
        f"{MIN_HEARTBEATS} x the {HEARTBEAT_S} s heartbeat)",
    )
    p.add_argument(
        "--notify",
        metavar="BLOCK",
        help="also notify through this notification block (e.g. custom-webhook/ops-alerts) when a run fails or crashes",
    )
    args = p.parse_args(argv)
    from pipeline_lib.errors import TokenmillError

    try:
        check_within(args.within)
        if args.notify:
            notify = install_failure_notification(args.notify)
            print(
                f"automation {notify.name!r} ({notify.id}): failed or crashed {FLOW_NAMES} runs notify through "
                f"{args.notify}"
            )
        automation = install(args.within)
    except TokenmillError as e:
        print(f"python -m deployments.automations: error: {e}", file=sys.stderr)
        return 2
    print(
        f"automation {automation.name!r} ({automation.id}): {FLOW_NAMES} runs without a heartbeat for "
        f"{args.within:.0f} s become Crashed"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
