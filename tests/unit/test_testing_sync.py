"""leasework.testing.run_job_sync: one attempt from synchronous test code (a unittest
TestCase here, as a Django test would be), in each lane, with what each outcome comes to."""

from __future__ import annotations

import unittest

import trio
import trio.lowlevel

import leasework
from leasework.errors import Permanent
from leasework.testing import run_job, run_job_sync

app = leasework.App("testing-sync")


@app.job("add_plain")
def add_plain(ctx, payload: dict) -> int:
    return payload["a"] + payload["b"]


@app.job("add_asyncio", runs_in="asyncio")
async def add_asyncio(ctx, payload: dict) -> int:
    import asyncio

    await asyncio.sleep(0)
    return payload["a"] + payload["b"]


@app.job("add_trio")
async def add_trio(ctx, payload: dict) -> int:
    await trio.lowlevel.checkpoint()
    return payload["a"] + payload["b"]


@app.job("refuse")
def refuse(ctx, payload: dict) -> None:
    raise Permanent("no such customer")


@app.job("slow")
def slow(ctx, payload: dict) -> None:
    import time

    time.sleep(0.5)


class RunJobSync(unittest.TestCase):
    def test_each_lane_runs_and_returns_its_result(self):
        for job_type in ("add_plain", "add_asyncio", "add_trio"):
            with self.subTest(job_type):
                run = run_job_sync(app, job_type, {"a": 2, "b": 3})
                self.assertTrue(run.succeeded)
                self.assertEqual(run.result, 5)

    def test_a_permanent_error_is_dead_and_a_timeout_failed(self):
        self.assertEqual(run_job_sync(app, "refuse", {}).status, "dead")
        timed_out = run_job_sync(app, "slow", {}, timeout_seconds=0.1)
        self.assertEqual(timed_out.status, "failed")
        self.assertIn("timed out", timed_out.error)

    def test_a_bad_payload_is_refused_as_every_door_would(self):
        with self.assertRaises(leasework.InvalidJob):
            run_job_sync(app, "add_plain", float("nan"))

    def test_from_inside_a_running_loop_it_says_to_await_run_job(self):
        async def inside() -> None:
            with self.assertRaises(RuntimeError):
                run_job_sync(app, "add_plain", {"a": 1, "b": 1})
            run = await run_job(app, "add_plain", {"a": 1, "b": 1})
            self.assertEqual(run.result, 2)

        trio.run(inside)
