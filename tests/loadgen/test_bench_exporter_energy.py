"""Energy from where the GPUs are: ``bench --power-metrics URL`` reads a DCGM (or AMD) exporter's Prometheus page
during the measured phase, for a server on another host, and gives energy per token beside tokens per dollar. A fake
exporter here serves a page whose energy counter rises at a known power."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from m3ctl.hw.power import ExporterPower, ProbeDeclined
from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.runner import BenchConfig, run_bench
from tests.conftest import groundtruth_pool

WATTS = {0: 300.0, 1: 450.0}


class FakeExporter:
    """A dcgm-exporter page: each GPU's power (W) and its energy counter (mJ) rising at that power since start."""

    def __init__(self, kind: str = "dcgm", clock=None):
        self.t0, self.kind, self.reads = time.monotonic(), kind, 0
        self.clock = clock or (lambda: time.monotonic() - self.t0)  # seconds the GPUs have run
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.reads += 1
                body = outer.page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def page(self) -> str:
        dt = self.clock()
        lines = ["# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
        for g, w in WATTS.items():
            host = f'Hostname="gpu-host",UUID="GPU-{g}"'
            if self.kind == "dcgm":
                lines.append(f'DCGM_FI_DEV_POWER_USAGE{{gpu="{g}",{host}}} {w}')
                lines.append(f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{g}",{host}}}\t{1e6 + w * dt * 1e3:.1f}')
            else:
                lines.append(f'GPU_POWER_USAGE{{gpu_id="{g}",{host}}} {w}')
                lines.append(f'GPU_ENERGY_CONSUMED{{gpu_id="{g}",{host}}} {w * dt * 1e6:.1f}')
        return "\n".join(lines) + "\n"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def exporter():
    e = FakeExporter()
    yield e
    e.close()


@pytest.mark.parametrize("kind", ["dcgm", "amd"])
def test_the_exporter_page_reads_as_a_power_source(kind):
    now = [10.0]
    e = FakeExporter(kind, clock=lambda: now[0])
    try:
        src = ExporterPower(e.url)
        assert src.gpus == [0, 1] and src.has_counter == {0, 1}
        assert src.name == ("dcgm-exporter" if kind == "dcgm" else "amd-exporter")
        a = src.read([0, 1])
        now[0] += 0.3
        b = src.read([0, 1])
        for ra, rb in zip(a, b, strict=True):
            assert ra.watts == WATTS[ra.gpu]
            assert rb.energy_j - ra.energy_j == pytest.approx(WATTS[ra.gpu] * 0.3, rel=1e-3)  # mJ / µJ read as J
    finally:
        e.close()


def test_a_page_of_no_known_exporter_is_declined(exporter):
    with pytest.raises(ProbeDeclined, match="no GPU power metric"):
        ExporterPower(exporter.url.replace("/metrics", "/nothing-here"), get=lambda *a, **k: _Resp("up 1\n"))


class _Resp:
    status_code = 200

    def __init__(self, text):
        self.text = text


def test_bench_gives_energy_per_token_from_the_exporter(exporter, tiny_models):
    with groundtruth_pool("--tokenizer", str(tiny_models["m2"]), "--no-metrics") as start:
        url = start("--ttft-ms", "20", "--itl-ms", "10")
        res = run_bench(
            BenchConfig(
                url=url,
                model="groundtruth",
                concurrency=4,
                num_prompts=24,
                input_len=16,
                output_len=20,
                power_metrics=exporter.url,
                power_interval_s=1.0,
                usd_per_gpu_hour=2.0,
                num_gpus=2,
                scrape_server_metrics=False,
            ),
            tok=LocalTokenizer(tiny_models["m2"]),
        )
    en = res["energy"]
    assert en["reason"] is None and en["source"] == "dcgm-exporter-energy-counter", en
    assert en["gpus"] == [0, 1] and exporter.reads >= 3
    # the counter rose at 750 W in all over the measured window: joules = 750 x duration
    assert en["joules"] == pytest.approx(750 * en["duration_s"], rel=0.05)
    assert en["output_tokens_per_joule"] == pytest.approx(res["total_output_tokens"] / en["joules"], rel=1e-6)
    assert res["cost"] is not None  # tokens per dollar beside tokens per joule
