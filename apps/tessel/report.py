# tessel report: one self-contained HTML page of a run folder, plots drawn by matplotlib as
# inline SVG. Reads summary.json, metrics.jsonl and, when the run was traced, trace.json.
# Usage (tessel runs it with the program on stdin): python3 - RUN_DIR OUT.html
# Every section is always present; one without data says what would fill it.
import html
import io
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("tessel report: needs matplotlib (Debian: apt-get install python3-matplotlib; "
             "scripts/setup.sh installs it)")

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.grid": True,
                     "grid.alpha": 0.3, "figure.dpi": 96})
MIB = 1 << 20
COLORS = {"compute": "#4c78a8", "comm": "#f58518", "idle": "#bab0ac"}
CATEGORY_COLORS = {"step": "#e8e8e8", "forward": "#4c78a8", "backward": "#54a24b",
                   "pipeline_forward": "#4c78a8", "pipeline_backward": "#54a24b",
                   "pipeline_weights": "#88d27a",
                   "comm": "#f58518", "p2p": "#e45756", "sync": "#f58518",
                   "optimizer": "#b279a2", "ps": "#9d755d", "data": "#bab0ac",
                   "checkpoint": "#222222"}


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_records(path):
    records = []
    if os.path.exists(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    return records


def svg(fig):
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prologue: the SVG sits inside HTML


def note(text):
    return '<p class="note">%s</p>' % html.escape(text)


def esc(value):
    return html.escape(str(value))


# ---- the trace ----

class Trace:
    """trace.json's spans by (pid, tid), thread and process names, and the steps it holds."""

    def __init__(self, doc):
        self.meta = doc.get("otherData", {})
        self.spans, self.threads, self.processes = [], {}, {}
        for e in doc["traceEvents"]:
            if e.get("ph") == "X":
                self.spans.append(e)
            elif e.get("ph") == "M" and e.get("name") == "thread_name":
                self.threads[(e["pid"], e["tid"])] = e["args"]["name"]
            elif e.get("ph") == "M" and e.get("name") == "process_name":
                self.processes[e["pid"]] = e["args"]["name"]

    def step_spans(self):
        return [s for s in self.spans if s["cat"] == "step" and s["name"] == "step"]

    def window(self, steps):
        """The time range of `steps` consecutive steps that every training rank traced."""
        by_step = {}
        for s in self.step_spans():
            by_step.setdefault(int(s["args"]["step"]), []).append(s)
        if not by_step:
            return None
        ranks = len({s["pid"] for s in self.step_spans()})
        complete = sorted(k for k, v in by_step.items() if len({s["pid"] for s in v}) == ranks)
        chosen = complete[-steps:] if complete else sorted(by_step)[-1:]
        picked = [s for k in chosen for s in by_step[k]]
        return (min(s["ts"] for s in picked), max(s["ts"] + s["dur"] for s in picked), chosen)


# ---- sections ----

def shown(key, value):
    """A summary value as a person reads it: 4 significant digits (no decimals from 1000 on),
    accuracies in percent, seconds to 0.1 s, bytes in MiB; summary.json keeps every digit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key.endswith("_bytes"):
        return "%.1f MiB" % (value / MIB)
    if isinstance(value, int):
        return "{:,}".format(value)
    if key.endswith("accuracy"):
        return "%.2f%%" % (100 * value)
    if key.endswith("seconds"):
        return "%.1f s" % value
    return "{:,.0f}".format(value) if abs(value) >= 1000 else "%.4g" % value


def overview(summary):
    keys = ["model", "dataset", "layout", "world_size", "zero_stage", "epochs", "steps",
            "train_loss", "train_accuracy", "test_loss", "test_accuracy", "samples_per_second",
            "train_seconds", "wall_seconds", "peak_rss_bytes", "completed"]
    rows = "".join("<tr><th>%s</th><td>%s</td></tr>" % (esc(k), esc(shown(k, summary.get(k))))
                   for k in keys if k in summary)
    straggler = summary.get("straggler")
    if straggler:
        rows += ('<tr class="warn"><th>straggler</th><td>rank %s computes %.2fx the median of '
                 'its peers per step</td></tr>' % (straggler["rank"], straggler["slowdown"]))
    else:
        rows += "<tr><th>straggler</th><td>none</td></tr>"
    ranks = summary.get("ranks", {})
    if "pipeline_bubble_fraction_measured" in ranks:
        rows += ("<tr><th>pipeline bubble</th><td>%.1f%% measured, %.1f%% modelled</td></tr>" %
                 (100 * ranks["pipeline_bubble_fraction_measured"],
                  100 * ranks["pipeline_bubble_fraction_model"]))
    return "<table>%s</table>" % rows


def curves(records):
    train = [r for r in records if r.get("type") == "train"]
    epochs = [r for r in records if r.get("type") == "epoch"]
    if not train and not epochs:
        return note("metrics.jsonl holds no records yet.")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, key, test_key, title in ((ax1, "loss", "test_loss", "loss"),
                                     (ax2, "accuracy", "test_accuracy", "accuracy")):
        if train:
            if key in train[0]:
                ax.plot([r["step"] for r in train], [r[key] for r in train], alpha=0.6,
                        label="train (mean since the last record)")
            ax.plot([r["step"] for r in train], [r["epoch_" + key] for r in train],
                    label="train (running mean of the epoch)")
        if epochs and test_key in epochs[0]:
            ax.plot([r["step"] for r in epochs], [r[test_key] for r in epochs], "o-",
                    label="test (after each epoch)")
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend()
    return svg(fig)


def throughput(records):
    train = [r for r in records if r.get("type") == "train"]
    if not train:
        return note("metrics.jsonl holds no train records yet.")
    fig, ax = plt.subplots(figsize=(10, 3))
    steps = [r["step"] for r in train]
    ax.plot(steps, [r["samples_per_second"] for r in train], color=COLORS["compute"])
    ax.set_xlabel("step")
    ax.set_ylabel("samples/s")
    if any("comm_exposed_share" in r for r in train):
        twin = ax.twinx()
        twin.plot(steps, [100 * r.get("comm_exposed_share", 0) for r in train],
                  color=COLORS["comm"], alpha=0.7)
        twin.set_ylabel("exposed communication (% of step time)", color=COLORS["comm"])
        twin.grid(False)
    return svg(fig)


def load_balance(summary):
    ranks = summary.get("ranks", {})
    per_rank = ranks.get("per_rank", [])
    if not per_rank:
        return note("summary.json holds no per-rank report (the run ended before an epoch did).")
    labels, compute, comm, idle = [], [], [], []
    for r in per_rank:
        steps = max(r.get("steps", 0), 1)
        wait = min(max(r["wait_for_slowest_seconds"], 0), r["comm_exposed_seconds"])
        labels.append("rank %d" % r["rank"])
        compute.append(1e3 * r["compute_seconds"] / steps)
        comm.append(1e3 * (r["comm_exposed_seconds"] - wait) / steps)
        idle.append(1e3 * wait / steps)
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(labels)))
    y = range(len(labels))
    ax.barh(y, compute, color=COLORS["compute"], label="compute")
    ax.barh(y, comm, left=compute, color=COLORS["comm"], label="exposed communication")
    ax.barh(y, idle, left=[a + b for a, b in zip(compute, comm)], color=COLORS["idle"],
            label="waiting for slower ranks (idle)")
    straggler = ranks.get("straggler") or summary.get("straggler")
    if straggler:
        k = straggler["rank"]
        ax.barh([k], [compute[k]], fill=False, edgecolor="#d62728", linewidth=2, hatch="//")
        ax.annotate(" straggler: x%.2f" % straggler["slowdown"], (compute[k] + comm[k] + idle[k], k),
                    va="center", color="#d62728")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (last epoch)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=8)
    return svg(fig) + note("load balance (max / mean compute): %.3f" %
                           ranks.get("load_balance_max_over_mean", 1.0))


def memory(summary):
    per_rank = summary.get("ranks", {}).get("per_rank", [])
    if not per_rank:
        return note("summary.json holds no per-rank report.")
    categories = list(per_rank[0]["memory"]["peak_bytes"])
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(per_rank)))
    left = [0.0] * len(per_rank)
    cmap = plt.get_cmap("tab10")
    for i, c in enumerate(categories):
        values = [r["memory"]["peak_bytes"][c] / MIB for r in per_rank]
        ax.barh(range(len(per_rank)), values, left=left, color=cmap(i), label=c)
        left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(range(len(per_rank)))
    ax.set_yticklabels(["rank %d" % r["rank"] for r in per_rank])
    ax.invert_yaxis()
    ax.set_xlabel("peak MiB per category (measured by the memory ledger, last epoch)")
    ax.legend(loc="lower right", fontsize=8, ncol=3)
    return svg(fig)


def draw_rows(ax, rows, t0, scale, height_of):
    """Spans (ts, dur in us) of each row as bars; `height_of(span)` gives (height, color)."""
    for y, spans in enumerate(rows):
        for s in spans:
            h, color = height_of(s)
            ax.broken_barh([((s["ts"] - t0) * scale, max(s["dur"] * scale, 1e-6))], (y - h / 2, h),
                           facecolors=color, edgecolors="none")


def pipeline(summary, trace):
    ranks = summary.get("ranks", {})
    if "pipeline_stages" not in ranks:
        return note("Not a pipeline run (pp.stages = 1).")
    if trace is None:
        return note("Run with --trace to draw the schedule.")
    window = trace.window(1)
    if window is None:
        return note("trace.json holds no step of the trace.steps window.")
    t0, t1, chosen = window
    pids = sorted({s["pid"] for s in trace.step_spans()})
    rows = [[s for s in trace.spans if s["pid"] == p and s["cat"].startswith("pipeline")
             and t0 <= s["ts"] < t1] for p in pids]
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * len(pids)))
    cmap = plt.get_cmap("tab10")

    def style(s):
        return 0.8, cmap(int(s["args"]["micro"]) % 10)

    draw_rows(ax, rows, t0, 1e-3, style)
    for y, spans in enumerate(rows):
        for s in spans:
            ax.text((s["ts"] - t0 + s["dur"] / 2) * 1e-3, y, s["name"], ha="center", va="center",
                    fontsize=7, color="white")
    stages = {st["rank"]: st for st in ranks["pipeline_stages"]}
    ax.set_yticks(range(len(pids)))
    ax.set_yticklabels(["rank %d stage %d (bubble %.0f%%)" %
                        (p, stages[p]["stage"], 100 * stages[p]["bubble_fraction"])
                        if p in stages else "rank %d" % p for p in pids])
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) * 1e-3)
    ax.set_xlabel("ms into step %d: F/B = forward/backward of micro-batch j; gaps are bubbles"
                  % chosen[-1])
    return svg(fig) + note("schedule %s, %d micro-batches; bubble %.1f%% measured (epoch), %.1f%% "
                           "modelled (P-1)/(m+P-1)" % (
                               ranks["pipeline_schedule"], ranks["pipeline_microbatches"],
                               100 * ranks["pipeline_bubble_fraction_measured"],
                               100 * ranks["pipeline_bubble_fraction_model"]))


def timeline(trace):
    if trace is None:
        return note("Run with --trace (or train.trace = true) to record trace.json.")
    window = trace.window(3)
    if window is None:
        return note("trace.json holds no step of the trace.steps window.")
    t0, t1, chosen = window
    keys = sorted({(s["pid"], s["tid"]) for s in trace.spans})
    rows = [sorted((s for s in trace.spans if (s["pid"], s["tid"]) == k and
                    s["ts"] < t1 and s["ts"] + s["dur"] > t0), key=lambda s: (s["ts"], -s["dur"]))
            for k in keys]
    depth = {}
    for spans in rows:  # nesting depth on each row (spans of one thread nest)
        stack = []
        for s in spans:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= s["ts"]:
                stack.pop()
            depth[id(s)] = len(stack)
            stack.append(s)
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.42 * len(keys)))

    def style(s):
        return 0.85 * 0.7 ** depth[id(s)], CATEGORY_COLORS.get(s["cat"], "#72b7b2")

    draw_rows(ax, rows, t0, 1e-3, style)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels(["%s: %s" % (trace.processes.get(p, p), trace.threads.get((p, t), t))
                        for p, t in keys])
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) * 1e-3)
    ax.set_xlabel("ms from the start of step %d (steps %s)" % (chosen[0], ", ".join(map(str, chosen))))
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in CATEGORY_COLORS.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=6, fontsize=7)
    offsets = trace.meta.get("clock_offset_us", [])
    return svg(fig) + note(
        "Every rank's clock aligned to rank 0's by offsets measured at the start (%s us, "
        "uncertainty up to %.1f us). Open trace.json in https://ui.perfetto.dev for every span "
        "and its arguments." % (", ".join("%.1f" % o for o in offsets),
                                max(trace.meta.get("clock_uncertainty_us", [0]) or [0])))


def staleness(summary):
    hist = summary.get("ranks", {}).get("ps_staleness_histogram")
    if hist is None:
        return note("Not a parameter-server run (ps.servers = 0).")
    if not hist:
        return note("No push was applied.")
    keys = sorted(hist, key=lambda k: int(k.rstrip("+")))
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.bar(range(len(keys)), [hist[k] for k in keys], color=COLORS["compute"])
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(keys)
    ax.set_xlabel("staleness of an applied push (server versions behind)")
    ax.set_ylabel("pushes")
    ranks = summary["ranks"]
    return svg(fig) + note("mode %s; mean staleness %.2f, max %d" % (
        ranks.get("ps_mode"), ranks.get("ps_staleness_mean", 0), ranks.get("ps_staleness_max", 0)))


def moved_bytes(span):
    """A span that moved data: collectives, pipeline receives, parameter-server pushes."""
    return span["cat"] in ("comm", "p2p", "ps") and "bytes" in span.get("args", {})


def collectives(summary, trace):
    per_rank = summary.get("ranks", {}).get("per_rank", [])
    if trace is None or not any(moved_bytes(s) for s in trace.spans):
        if not any(r.get("comm_bytes", 0) for r in per_rank):
            return note("No collective recorded (run with --trace to see every transfer).")
        fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(per_rank)))
        ax.barh(range(len(per_rank)), [r["comm_bytes"] / MIB for r in per_rank],
                color=COLORS["comm"])
        ax.set_yticks(range(len(per_rank)))
        ax.set_yticklabels(["rank %d" % r["rank"] for r in per_rank])
        ax.set_xlabel("MiB communicated in the last epoch (run with --trace for every collective)")
        return svg(fig)
    comm = [s for s in trace.spans if moved_bytes(s)]
    steps = max(len({s["args"]["step"] for s in trace.step_spans()}), 1)
    totals = {}
    for s in comm:
        key = s["name"] if s["cat"] == "comm" else "%s (%s)" % (s["name"], s["cat"])
        totals.setdefault(key, [0, 0, 0.0])
        totals[key][0] += s["args"]["bytes"]
        totals[key][1] += 1
        totals[key][2] += s["dur"]
    names = sorted(totals, key=lambda k: -totals[k][0])
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(names)))
    ax.barh(range(len(names)), [totals[k][0] / steps / MIB for k in names], color=COLORS["comm"])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("MiB per traced step, summed over the ranks")
    rows = "".join("<tr><td>%s</td><td>%d</td><td>%.2f</td><td>%.1f</td></tr>" % (
        esc(k), totals[k][1] // steps, totals[k][0] / steps / MIB, totals[k][2] / totals[k][1])
        for k in names)
    table = ("<table><tr><th>transfer</th><th>calls per step</th><th>MiB per step</th>"
             "<th>mean us per call</th></tr>%s</table>" % rows)
    return svg(fig) + table


def main():
    run_dir, out = sys.argv[1], sys.argv[2]
    summary = read_json(os.path.join(run_dir, "summary.json"))
    records = read_records(os.path.join(run_dir, "metrics.jsonl"))
    trace_path = os.path.join(run_dir, "trace.json")
    trace = Trace(read_json(trace_path)) if os.path.exists(trace_path) else None
    sections = [
        ("overview", "Overview", overview(summary)),
        ("curves", "Loss and accuracy", curves(records)),
        ("throughput", "Throughput", throughput(records)),
        ("load-balance", "Load balance: compute, exposed communication, idle per rank",
         load_balance(summary)),
        ("memory", "Memory per category per rank", memory(summary)),
        ("pipeline", "Pipeline schedule", pipeline(summary, trace)),
        ("timeline", "Timeline", timeline(trace)),
        ("staleness", "Parameter-server staleness", staleness(summary)),
        ("collectives", "Bytes per collective", collectives(summary, trace)),
    ]
    nav = " | ".join('<a href="#%s">%s</a>' % (i, esc(t)) for i, t, _ in sections)
    body = "".join('<section id="%s"><h2>%s</h2>%s</section>\n' % (i, esc(t), b)
                   for i, t, b in sections)
    name = os.path.basename(os.path.normpath(run_dir))
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>tessel report: %s</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222}"
            "section{border-top:1px solid #ccc;padding:0.5em 0}svg{max-width:100%%;height:auto}"
            "table{border-collapse:collapse}th,td{padding:2px 10px;text-align:left}"
            "th{color:#555}.note{color:#666}.warn{color:#d62728;font-weight:bold}"
            "</style></head><body><h1>tessel report: %s</h1><p>%s</p><nav>%s</nav>\n%s"
            "</body></html>\n" % (esc(name), esc(name), esc(os.path.abspath(run_dir)), nav, body))
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(page)
    os.replace(tmp, out)


main()
