"""The launcher's follower (`deployments.follow.follow`) against a real Prefect server: every
log line of a run and of each of its subflow runs printed once, including subflows that begin
and log between two of its polls, while it asks the server only every few seconds."""

from __future__ import annotations

import threading
import time
from uuid import uuid4

import pytest
from test_e2e_deployment import _client, needs_server

from deployments import follow


@pytest.mark.server
@needs_server
def test_follow_prints_each_line_of_the_run_and_its_subflows_once(capsys):
    from prefect import flow, get_run_logger
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    name = f"follow-{uuid4().hex[:8]}"

    @flow(name="follow-child")
    def child(k: int) -> None:
        get_run_logger().info(f"child {k} says hello")

    @flow(name="follow-parent", flow_run_name=name)
    def parent() -> None:
        log = get_run_logger()
        time.sleep(4)  # the follower is polling by now
        log.info("parent starts")
        child(1)  # two subflows begin and log within a second: one poll sees both
        child(2)
        log.info("parent between")
        time.sleep(4)
        child(3)
        time.sleep(4)  # the last lines reach the server before the run ends

    thread = threading.Thread(target=parent)
    thread.start()
    try:
        run_id, deadline = None, time.monotonic() + 120
        with _client() as client:
            while run_id is None and time.monotonic() < deadline:
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))
                )
                run_id = runs[0].id if runs else None
                time.sleep(0.2)
        assert run_id is not None, "the flow run never appeared"
        t0 = time.monotonic()
        final = follow.follow(run_id, timeout=300, server_every=3.0)
        assert time.monotonic() - t0 < 300
    finally:
        thread.join(timeout=300)
    assert final.state.is_completed()
    err = capsys.readouterr().err
    for line in ("parent starts", "child 1 says hello", "child 2 says hello", "parent between",
                 "child 3 says hello"):  # fmt: skip
        assert err.count(line) == 1, (line, err)
    assert err.index("child 2 says hello") < err.index("child 3 says hello")
