#!/usr/bin/env python3
"""The aggregations of bench/plan_validate/run.py: a layout's step time is the median of its
records past the warm-up, and its repeats' median and spread."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                                "plan_validate"))
from run import repeats_summary, step_seconds  # noqa: E402


def record(step, samples_per_second):
    return {"type": "train", "step": step, "samples_per_second": samples_per_second}


class StepSeconds(unittest.TestCase):
    def test_leaves_out_the_warm_up_and_takes_the_median(self):
        # batch 100: 1000 samples/s is 0.1 s a step; the records of the first 10 steps (a slow
        # warm-up, most of the records) and a window a burst of load fell on do not count
        recs = [record(s, 100) for s in (2, 4, 6, 8, 10)] + \
            [record(15, 1000), record(20, 1000), record(25, 200)]
        self.assertAlmostEqual(step_seconds(recs, 100, 10), 0.1)

    def test_too_short_a_run_keeps_all_but_the_first_record(self):
        recs = [record(5, 100), record(10, 500), record(15, 1000), record(20, 1000)]
        self.assertAlmostEqual(step_seconds(recs, 100, 20), 0.1)
        self.assertAlmostEqual(step_seconds(recs[:1], 100, 20), 1.0)


class RepeatsSummary(unittest.TestCase):
    def test_median_and_spread(self):
        m, spread = repeats_summary([0.020, 0.016, 0.015])
        self.assertAlmostEqual(m, 0.016)
        self.assertAlmostEqual(spread, 0.005 / 0.016)
        self.assertEqual(repeats_summary([0.3]), (0.3, 0.0))


if __name__ == "__main__":
    unittest.main()
