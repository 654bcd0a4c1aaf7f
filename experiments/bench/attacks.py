"""Hostile inputs and faults against what a user shares and serves, each measured as the user
meets it: an LM that hangs or is gone, a stop signal during a hung question, a huge body, another
site's request, a PDF that expands to 64,000 pages or inflates to 40 MB of text operators, a
recorded-calls file of newlines, and links out of a folder.

    python -m experiments.bench.attacks --work /tmp/hyperprove-attacks      # about 2 minutes on 2 cores

Each case runs the real command (`hyperprove serve` in its own process over the demo index, with
the packaged embedder; `hyperprove index` on a folder; `read_record` in its own process) and
prints one row: what was tried, what the user sees, seconds, peak memory where it matters, and
what was lost (nothing: every row ends "nothing"). Rows as JSON go to `--work`/attacks.json.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from experiments.bench.postgres import free_port

ROOT = Path(__file__).resolve().parents[2]


class HangingLM:
    """An LM endpoint that accepts connections and never answers."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.address = f"http://127.0.0.1:{self.socket.getsockname()[1]}/v1"

    def close(self) -> None:
        self.socket.close()


def pdf_file(objects: list[bytes]) -> bytes:
    """A PDF of these objects (numbered from 1; 1 is the catalog) with a correct cross-reference table."""
    out, offsets = io.BytesIO(), []
    out.write(b"%PDF-1.4\n")
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    table = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1) + b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, table))
    return out.getvalue()


FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def page_tree_bomb() -> bytes:
    """1.4 KB: a page tree whose three levels each name one node 40 times: 64,000 pages."""
    def kids(number: int) -> bytes:
        return b"[" + b" ".join([b"%d 0 R" % number] * 40) + b"]"

    return pdf_file([b"<< /Type /Catalog /Pages 2 0 R >>",
                     b"<< /Type /Pages /Kids " + kids(3) + b" /Count 64000 >>",
                     b"<< /Type /Pages /Kids " + kids(4) + b" /Count 1600 >>",
                     b"<< /Type /Pages /Kids " + kids(5) + b" /Count 40 >>",
                     b"<< /Type /Page /MediaBox [0 0 612 792] /Contents 6 0 R /Resources << /Font << /F1 7 0 R >> >> >>",
                     b"<< /Length 33 >>\nstream\nBT /F1 12 Tf (Bomb page.) Tj ET\nendstream", FONT])


def inflating_pdf(megabytes: float) -> bytes:
    """One page whose compressed content stream of text operators inflates to `megabytes` MB."""
    content = zlib.compress(b"BT /F1 12 Tf " + b"(a) Tj " * int(megabytes * 2**20 // 7) + b" ET", 9)
    return pdf_file([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                     b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
                     b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream", FONT])


def newline_record(path: Path, megabytes: int = 320) -> Path:
    """A recorded-calls file whose header is right and whose body is `megabytes` MB of newlines (310 KB gzip'd)."""
    from pipeline.lm.record import RECORD_FORMAT, RECORD_VERSION

    with gzip.open(path, "wb", compresslevel=9) as handle:
        handle.write(json.dumps({"format": RECORD_FORMAT, "version": RECORD_VERSION, "calls": 1}).encode() + b"\n")
        for _ in range(megabytes):
            handle.write(b"\n" * 2**20)
    return path


def peak_mb(pid: int | str = "self") -> int:
    """A process's peak resident memory (VmHWM), MB."""
    return int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) // 1024


def resident_mb(pid: int) -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) // 1024


def post(url: str, body: bytes, headers: dict, timeout: float = 900) -> tuple[int, str, float]:
    """Status, error text and seconds of one POST."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=timeout) as reply:
            return reply.status, "", time.perf_counter() - started
    except urllib.error.HTTPError as refused:
        text = refused.read().decode("utf-8", "replace")
        try:
            text = json.loads(text).get("error", text)
        except ValueError:
            pass
        return refused.code, text, time.perf_counter() - started
    except OSError as failure:  # the server went away
        return 0, str(failure), time.perf_counter() - started


class Served:
    """`hyperprove serve` over an index in its own process, at an LM address."""

    def __init__(self, index: Path, api_base: str, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "pipeline.cli", "serve", str(index), "--port", str(self.port), "--no-track",
                   "--api-base", api_base, *flags]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("serve did not come up")

    def ask(self, question: str = "Who is the father of Davy Crockett?") -> tuple[int, str, float]:
        return post(f"{self.url}/ask", json.dumps({"question": question}).encode(), {"Content-Type": "application/json"})

    def stop(self) -> tuple[float, str]:
        started = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        finally:
            self.process.kill()
        return time.perf_counter() - started, self.process.stdout.read()


def stated_seconds(log: str) -> str:
    found = re.search(r"a 503 within (\d+) s", log)
    return found.group(1) if found else "?"


def huge_body(url: str, length: int = 300_000_000) -> tuple[int, str]:
    """Announce a 300 MB body, send the first MB, and read the reply."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(f"POST /ask HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {length}\r\n\r\n".encode())
        try:
            connection.sendall(b"x" * 2**20)
        except OSError:
            pass
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.decode("latin-1").partition("\r\n\r\n")
    return int(head.split()[1]), body


def cases(work: Path) -> list[dict]:
    rows: list[dict] = []

    def row(case: str, sees: str, seconds: float | None = None, memory: str = "", lost: str = "nothing") -> None:
        rows.append({"case": case, "user sees": sees, "seconds": None if seconds is None else round(seconds, 1), "memory": memory, "lost": lost})
        print(f"| {case} | {sees} | {'' if seconds is None else f'{seconds:.1f}'} | {memory} | {lost} |", flush=True)

    index = work / "demo-index"
    if not (index / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "pipeline.cli", "index", str(ROOT / "experiments/demo/corpus.json"), "--out", str(index)],
                       cwd=ROOT, check=True, capture_output=True)
    print("| case | what the user sees | s | memory | lost |\n|---|---|---:|---|---|")

    hanging = HangingLM()
    served = Served(index, hanging.address, "--lm-timeout", "10", "--lm-retries", "1")
    status, message, seconds = served.ask()
    row("an LM that accepts and never answers (`serve --lm-timeout 10 --lm-retries 1`)", f"{status}: {message[:70]}", seconds)
    asking = threading.Thread(target=served.ask, daemon=True)
    asking.start()
    time.sleep(2)
    seconds, log = served.stop()
    log_line = stated_seconds(log)
    row("SIGTERM while a question waits on that LM", f"exit {served.process.returncode}, 'serve stopped (SIGTERM)'", seconds)
    rows[-2]["user sees"] += f" (stated: within {log_line} s)"
    hanging.close()

    dead = f"http://127.0.0.1:{free_port()}/v1"
    served = Served(index, dead)
    status, message, seconds = served.ask()
    row("an LM that is gone (`serve` defaults: 120 s a request, 1 retry)", f"{status}: {message[:70]}", seconds)
    before = resident_mb(served.process.pid)
    status, message = huge_body(served.url)
    row("POST announcing a 300 MB body", f"{status}: {message[:60]}", None, f"server RSS {before} -> {resident_mb(served.process.pid)} MB")
    status, message, _ = post(f"{served.url}/ask", b'{"question": "x"}', {"Content-Type": "application/json", "Host": "rebound.example:80"})
    row("DNS rebinding (`Host: rebound.example`)", f"{status}: {message}")
    status, message, _ = post(f"{served.url}/ask", b'{"question": "x"}', {"Content-Type": "text/plain", "Origin": "http://evil.example"})
    row("another site's `text/plain` form post", f"{status}: {message}")
    status, message, _ = post(f"{served.url}/ask", b'{"question": "x"}', {"Content-Type": "text/plain"})
    row("a `text/plain` post with no Origin", f"{status}: {message}")
    status, message, _ = post(f"{served.url}/ask", b"[" * 8000 + b"]" * 8000, {"Content-Type": "application/json"})
    row("JSON nested 8,000 deep", f"{status}: {message}")
    served.stop()

    folder = work / "folder"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "docs").mkdir(parents=True)
    (folder / "secret").write_text("aws_secret_access_key = SECRET")
    (folder / "docs" / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (folder / "docs" / "notes.txt").symlink_to(folder / "secret")
    (folder / "docs" / "pages.pdf").write_bytes(page_tree_bomb())
    (folder / "docs" / "text.pdf").write_bytes(inflating_pdf(40))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "index", str(folder / "docs"), "--out", str(folder / "idx")],
                          cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    skipped = [f"{Path(path).name}: {why.split(' (')[0].split(', ')[-1]}"
               for path, _, why in (line.partition(": skipped: ") for line in done.stdout.splitlines() if ": skipped: " in line)]
    leaked = "SECRET" in (folder / "idx" / "passages.jsonl").read_text()
    sizes = [(folder / "docs" / name).stat().st_size / 1024 for name in ("pages.pdf", "text.pdf")]
    row(f"a folder with a 64,000-page PDF ({sizes[0]:.1f} KB), a PDF of 40 MB of text operators ({sizes[1]:.0f} KB) and a link to a secret",
        f"exit {done.returncode}; " + "; ".join(skipped), seconds, lost="nothing" if not leaked else "THE SECRET WAS INDEXED")

    record = newline_record(work / "lm_calls.jsonl.gz")
    script = ("import sys; from pipeline.lm.record import read_record; from experiments.bench.attacks import peak_mb\n"
              "try:\n    read_record(sys.argv[1])\nexcept Exception as error:\n    print(error)\nprint(peak_mb())")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script, str(record)], cwd=ROOT, capture_output=True, text=True)
    message, peak = done.stdout.strip().splitlines()
    row(f"a recorded-calls file of newlines ({record.stat().st_size // 1024} KB gzip'd, 320 MB inflated)",
        message.split(": ", 1)[1], time.perf_counter() - started, f"peak {peak} MB")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/hyperprove-attacks", help="a scratch folder")
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = cases(work)
    (work / "attacks.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(row["lost"] == "nothing" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
