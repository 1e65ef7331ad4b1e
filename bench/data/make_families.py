"""Real CPU training families for the forecast benchmarks: tiny Transformers, five tasks.

A width family (same data, same cosine schedule, widths spanning ~30k to ~1M parameters) and,
at one mid width, the same model under other schedules (constant, a longer cosine, WSD).
Five tasks, each in its own folder:

- ``markov`` (``cpu_families/``): a seeded mixture of sparse order-1, order-2 and order-3
  Markov chains over 64 tokens, capacity-limited on purpose (the larger tables need more
  parameters to hold);
- ``code`` (``cpu_code_families/``): the bytes of the Python standard library's own source
  files on this machine, real text with no designed structure;
- ``man`` (``cpu_man_families/``): the bytes of this machine's English manual pages of
  sections 5, 7 and 8 (roff source: prose with markup), made after the forecast was built,
  as a family nothing in it was set on;
- ``perl`` (``cpu_perl_families/``): the bytes of this machine's Perl 5 library (modules
  and their POD documentation), made after the size laws' regime was set, to test it;
- ``c`` (``cpu_c_families/``): the bytes of this machine's C headers (``/usr/include``
  without its C++ trees), made after the line was left out of the size laws' mean, to
  test that.

Each run is written as a gzipped long-format CSV (run, step, metric, value) and its config
goes to ``runs.json``, as runwatch reads configs.

    python bench/data/make_families.py [--task code|man|perl|c]  # all, into the task's folder
    python bench/data/make_families.py --probe 600        # smallest vs largest width, briefly

How the data were made and how long it took: each folder's SOURCES.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("runwatch.bench.make_families")

VOCAB, CONTEXT, BATCH = 64, 16, 48
ORDERS = (1, 2, 3)  # the chain's orders, each chosen per token with MIX_WEIGHTS
MIX_WEIGHTS = (0.3, 0.6, 0.1)
SUCCESSORS = (4, 3, 2)  # sparse tables: each context of order k has this many next tokens
N_TRAIN_CHAINS, N_HELDOUT_CHAINS, CHAIN_LEN = 512, 32, 8192
VAL_BATCHES, VAL_BATCH = 8, 128
WIDTHS = (32, 48, 64, 96, 128, 192)
MID_WIDTH = 64
PEAK_LR, WARMUP, FINAL_FRACTION = 2e-3, 100, 0.1
VAL_EVERY = 50
OUT = Path(__file__).resolve().parent / "cpu_families"
CODE_OUT = Path(__file__).resolve().parent / "cpu_code_families"
MAN_OUT = Path(__file__).resolve().parent / "cpu_man_families"
MAN_ROOT = Path("/usr/share/man")
MAN_SECTIONS = ("man5", "man7", "man8")  # file formats, overviews, administration: prose
PERL_OUT = Path(__file__).resolve().parent / "cpu_perl_families"
PERL_ROOT = Path("/usr/share/perl")
C_OUT = Path(__file__).resolve().parent / "cpu_c_families"
C_ROOT = Path("/usr/include")
C_SKIP = ("c++", "llvm", "node")  # C++ trees: their headers are C++, not C
CODE_VOCAB, CODE_CONTEXT, CODE_BATCH = 128, 32, 32  # bytes; non-ASCII bytes share token 127
CODE_ROW = 4096  # the byte stream is cut into rows of this length, as the Markov chains are
CODE_HELDOUT_EVERY = 16  # every 16th file (sorted by path) is held out


@dataclass(frozen=True)
class Task:
    """What a family trains on: the token rows, the held-out batches, the shapes."""

    name: str
    prefix: str  # the runs' names start with it
    vocab: int
    context: int
    batch: int
    train: np.ndarray  # (rows, length) int64 tokens
    val_batches: list
    out: Path


def make_tables(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per order, (next tokens, cumulative probabilities) for every context, both
    shaped (VOCAB**order, successors): a random sparse next-token table."""
    rng = np.random.default_rng(seed)
    tables = []
    for order, k in zip(ORDERS, SUCCESSORS, strict=True):
        n_ctx = VOCAB**order
        nxt = np.argsort(rng.random((n_ctx, VOCAB)), axis=1)[:, :k]
        probs = rng.dirichlet(np.ones(k), size=n_ctx)
        tables.append((nxt, np.cumsum(probs, axis=1)))
    return tables


def make_chains(n_chains: int, length: int, seed: int, table_seed: int = 0) -> np.ndarray:
    """``n_chains`` independent chains of ``length`` tokens (int64), run side by side.

    Each token picks an order from MIX_WEIGHTS, then its next token from that order's
    table given the last ``order`` tokens. Deterministic in (seed, table_seed)."""
    tables = make_tables(table_seed)
    rng = np.random.default_rng(seed)
    out = np.empty((n_chains, length), dtype=np.int64)
    out[:, :3] = rng.integers(0, VOCAB, (n_chains, 3))
    mix = np.cumsum(MIX_WEIGHTS)
    rows = np.arange(n_chains)
    for i in range(3, length):
        which = np.searchsorted(mix, rng.random(n_chains), side="right")
        u = rng.random(n_chains)
        token = np.empty(n_chains, dtype=np.int64)
        for o, (order, (nxt, cum)) in enumerate(zip(ORDERS, tables, strict=True)):
            sel = rows[which == o]
            if sel.size == 0:
                continue
            ctx = np.zeros(sel.size, dtype=np.int64)
            for back in range(order, 0, -1):
                ctx = ctx * VOCAB + out[sel, i - back]
            pick = (u[sel, None] > cum[ctx]).sum(axis=1).clip(max=cum.shape[1] - 1)
            token[sel] = nxt[ctx, pick]
        out[:, i] = token
    return out


def true_cross_entropy(chains: np.ndarray, table_seed: int = 0) -> float:
    """Mean -log p(next | last 3) under the generating mixture: the loss floor, in nats."""
    tables = make_tables(table_seed)
    total, count = 0.0, 0
    for row in chains:
        nxt_tok = row[3:]
        prob = np.zeros(nxt_tok.size)
        for weight, order, (nxt, cum) in zip(MIX_WEIGHTS, ORDERS, tables, strict=True):
            ctx = np.zeros(nxt_tok.size, dtype=np.int64)
            for back in range(order, 0, -1):
                ctx = ctx * VOCAB + row[3 - back : row.size - back]
            p = np.diff(cum[ctx], axis=1, prepend=0.0)
            prob += weight * (p * (nxt[ctx] == nxt_tok[:, None])).sum(axis=1)
        total += float(-np.log(prob).sum())
        count += nxt_tok.size
    return total / count


def lr_share(schedule: dict, total_steps: int, step: int) -> float:
    """The LR at ``step`` as a share of the peak; the same numbers as
    runwatch.expect.planned.planned_lr (tests/bench/test_make_families.py checks it)."""
    warm = float(schedule.get("warmup", 0))
    floor = float(schedule.get("final_lr_fraction", 0.0))
    name = schedule["name"]
    share = 1.0
    if name != "constant":
        start = float(schedule["decay_start"]) if name == "wsd" else warm
        shape = schedule.get("decay_shape", "linear") if name == "wsd" else name
        t = min(max((step - start) / max(total_steps - start, 1.0), 0.0), 1.0)
        left = 0.5 * (1.0 + math.cos(math.pi * t)) if shape == "cosine" else 1.0 - t
        share = floor + (1.0 - floor) * left
    if warm > 0 and step < warm:
        share = share * (step + 1.0) / warm
    return share


def schedule_for(name: str, total_steps: int) -> dict:
    sched = {"name": name, "warmup": WARMUP, "final_lr_fraction": FINAL_FRACTION}
    if name == "wsd":
        sched |= {"decay_start": int(total_steps * 0.8), "decay_shape": "linear"}
    return sched | {"peak_lr": PEAK_LR}


def run_name(width: int, schedule: dict, total_steps: int, seed: int, prefix="cpu") -> str:
    kind = schedule["name"]
    if kind == "wsd":
        kind = f"wsd_{schedule['decay_start']}"
    return f"{prefix}_w{width}_{kind}_{total_steps}" + (f"_seed{seed}" if seed else "")


def build_model(width: int, seed: int, vocab: int = VOCAB, context: int = CONTEXT):
    """A 2-layer pre-norm causal Transformer, 4 heads, feed-forward 4x the width."""
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(torch.zeros(context, width))
            layer = nn.TransformerEncoderLayer(
                width,
                nhead=4,
                dim_feedforward=4 * width,
                dropout=0.0,
                batch_first=True,
                norm_first=True,
            )
            self.body = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab)
            mask = nn.Transformer.generate_square_subsequent_mask(context)
            self.register_buffer("mask", mask)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x) + self.pos
            return self.head(self.norm(self.body(h, mask=self.mask, is_causal=True)))

    torch.manual_seed(seed)
    return TinyLM()


def batch_at(chains, chain_idx, offsets, context: int = CONTEXT):
    """Inputs and next-token targets for the windows starting at ``offsets``."""
    import torch

    cols = offsets[:, None] + np.arange(context + 1)
    windows = torch.from_numpy(chains[chain_idx[:, None], cols])
    return windows[:, :-1], windows[:, 1:]


def train_run(width, schedule, total_steps, seed, task: Task) -> tuple[list, dict]:
    """Train one run; (rows of (step, metric, value), its runs.json config)."""
    import torch
    from torch import nn

    model = build_model(width, seed, task.vocab, task.context)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.0)
    rng = np.random.default_rng(1000 + seed)  # the batch order: the same for every width
    rows: list[tuple[int, str, float]] = []

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            losses = [
                nn.functional.cross_entropy(model(x).reshape(-1, task.vocab), y.reshape(-1)).item()
                for x, y in task.val_batches
            ]
        model.train()
        return float(np.mean(losses))

    for step in range(total_steps):
        lr = PEAK_LR * lr_share(schedule, total_steps, step)
        for group in opt.param_groups:
            group["lr"] = lr
        chain_idx = rng.integers(0, task.train.shape[0], task.batch)
        offsets = rng.integers(0, task.train.shape[1] - task.context - 1, task.batch)
        x, y = batch_at(task.train, chain_idx, offsets, task.context)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, task.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rows.append((step, "loss", round(loss.item(), 5)))
        rows.append((step, "lr", lr))
        if step % VAL_EVERY == 0 or step == total_steps - 1:
            rows.append((step, "val_loss", round(val_loss(), 5)))
    config = {
        "params": params,
        "total_steps": total_steps,
        "tokens_per_step": task.batch * task.context,
        "schedule": schedule,
        "width": width,
        "seed": seed,
    }
    return rows, config


def write_csv(path: Path, name: str, rows: list) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write("run,step,metric,value\n")
        f.writelines(f"{name},{step},{metric},{value!r}\n" for step, metric, value in rows)


def heldout_batches(heldout: np.ndarray, context: int) -> list:
    """A fixed set of held-out batches (seed 3): every run is judged on the same tokens."""
    vrng = np.random.default_rng(3)
    return [
        batch_at(
            heldout,
            vrng.integers(0, heldout.shape[0], VAL_BATCH),
            vrng.integers(0, heldout.shape[1] - context - 1, VAL_BATCH),
            context,
        )
        for _ in range(VAL_BATCHES)
    ]


def markov_task() -> Task:
    """The Markov-mixture task; logs its held-out loss floor."""
    train = make_chains(N_TRAIN_CHAINS, CHAIN_LEN, seed=1)
    heldout = make_chains(N_HELDOUT_CHAINS, CHAIN_LEN, seed=2)
    log.info("held-out loss floor %.4f nats", true_cross_entropy(heldout))
    val = heldout_batches(heldout, CONTEXT)
    return Task("markov", "cpu", VOCAB, CONTEXT, BATCH, train, val, OUT)


def stdlib_sources(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted by path, without tests and packages."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "dist-packages", "idle_test"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts[:-1]))


def text_rows(blobs: list[bytes], row: int = CODE_ROW) -> np.ndarray:
    """The texts' bytes, one NUL between texts, as tokens in rows of ``row`` (the tail that
    does not fill a row is dropped). Bytes above 126 become token 127."""
    stream = np.frombuffer(b"\0".join(blobs), dtype=np.uint8)
    tokens = np.minimum(stream, CODE_VOCAB - 1).astype(np.int64)
    n = tokens.size // row
    return tokens[: n * row].reshape(n, row)


def text_task(name: str, blobs: list[bytes], out: Path) -> Task:
    """Byte-level language modelling of ``blobs``, every ``CODE_HELDOUT_EVERY``-th held out."""
    train = text_rows([b for i, b in enumerate(blobs) if i % CODE_HELDOUT_EVERY])
    heldout = text_rows(blobs[::CODE_HELDOUT_EVERY])
    log.info("%d texts: %d training bytes, %d held out", len(blobs), train.size, heldout.size)
    val = heldout_batches(heldout, CODE_CONTEXT)
    return Task(name, name, CODE_VOCAB, CODE_CONTEXT, CODE_BATCH, train, val, out)


def code_task(root: Path | None = None) -> Task:
    """Byte-level language modelling of the standard library's source on this machine."""
    return text_task("code", [p.read_bytes() for p in stdlib_sources(root)], CODE_OUT)


def man_pages(root: Path = MAN_ROOT) -> list[Path]:
    """The gzipped English manual pages of ``MAN_SECTIONS``, sorted by path."""
    return sorted(p for s in MAN_SECTIONS for p in (root / s).glob("*.gz"))


def man_task(root: Path = MAN_ROOT) -> Task:
    """Byte-level language modelling of this machine's manual pages (their roff source)."""
    blobs = [gzip.decompress(p.read_bytes()) for p in man_pages(root)]
    return text_task("man", blobs, MAN_OUT)


def perl_sources(root: Path = PERL_ROOT) -> list[Path]:
    """The Perl library's modules and POD documents, sorted by path."""
    return sorted(p for p in root.rglob("*") if p.suffix in (".pm", ".pod") and p.is_file())


def perl_task(root: Path = PERL_ROOT) -> Task:
    """Byte-level language modelling of this machine's Perl 5 library."""
    return text_task("perl", [p.read_bytes() for p in perl_sources(root)], PERL_OUT)


def c_headers(root: Path = C_ROOT) -> list[Path]:
    """The C headers under ``root``, sorted by path, without the C++ trees (``C_SKIP``)."""
    return sorted(
        p
        for p in root.rglob("*.h")
        if p.is_file() and not p.relative_to(root).parts[0].startswith(C_SKIP)
    )


def c_task(root: Path = C_ROOT) -> Task:
    """Byte-level language modelling of this machine's C headers."""
    return text_task("c", [p.read_bytes() for p in c_headers(root)], C_OUT)


TASKS = {
    "markov": markov_task,
    "code": code_task,
    "man": man_task,
    "perl": perl_task,
    "c": c_task,
}


def plan(seeds2: bool) -> list[tuple[int, dict, int, int]]:
    """(width, schedule, total_steps, seed) of every run, the family first."""
    runs = [(w, schedule_for("cosine", 2000), 2000, 0) for w in WIDTHS]
    runs += [(MID_WIDTH, schedule_for(n, 4000), 4000, 0) for n in ("constant", "cosine", "wsd")]
    if seeds2:
        runs += [(w, schedule_for("cosine", 2000), 2000, 1) for w in WIDTHS[-2:]]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=tuple(TASKS), default="markov")
    parser.add_argument("--out", type=Path, help="default: the task's folder")
    parser.add_argument("--probe", type=int, help="only train the smallest and largest width")
    parser.add_argument("--second-seed", action="store_true", help="also seed 1 of the 2 widest")
    parser.add_argument("--only", help="only the runs whose name contains this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    import torch

    torch.set_num_threads(1)  # one core: the machine's other core stays free
    began = time.perf_counter()
    task = TASKS[args.task]()
    log.info("%s corpus ready in %.1f s", task.name, time.perf_counter() - began)

    if args.probe:
        for width in (WIDTHS[0], WIDTHS[-1]):
            t0 = time.perf_counter()
            rows, config = train_run(width, schedule_for("cosine", args.probe), args.probe, 0, task)
            vals = [v for _, m, v in rows if m == "val_loss"]
            log.info(
                "probe w%d (%d params): val %s in %.1f s",
                width,
                config["params"],
                " ".join(f"{v:.3f}" for v in vals[:: max(1, len(vals) // 6)] + vals[-1:]),
                time.perf_counter() - t0,
            )
        return

    out = args.out or task.out
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "runs.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    for width, schedule, total_steps, seed in plan(args.second_seed):
        name = run_name(width, schedule, total_steps, seed, task.prefix)
        if args.only and args.only not in name:
            continue
        t0 = time.perf_counter()
        rows, config = train_run(width, schedule, total_steps, seed, task)
        write_csv(out / f"{name}.csv.gz", name, rows)
        index = json.loads(index_path.read_text()) if index_path.exists() else {}
        index[name] = config
        index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")
        final = [v for _, m, v in rows if m == "val_loss"][-1]
        log.info(
            "%s: %d params, final val %.4f, %.0f s",
            name,
            config["params"],
            final,
            time.perf_counter() - t0,
        )
    log.info("all done in %.0f s", time.perf_counter() - began)


if __name__ == "__main__":
    main()
