"""The control room in a real browser against the real system: sign in, create a run in
the form, start it, watch it train live on a map drawn with no request leaving the
host, kill an island from its button, see it lost (its link down on the map, a lost
span on its timeline lane, which the page fetched only since what it had) while the
global model keeps moving, rejoin it. The page
fits the operator's screen with 8 islands. A screenshot of each step is kept."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from webapp.runs.lifecycle import create_run
from webapp.runs.models import Run
from webapp.runs.roles import operators_group

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PASSWORD = "islands-4-ever"


@pytest.fixture
def operator(django_user_model, transactional_db):
    user = django_user_model.objects.create_user("olga", password=PASSWORD)
    user.groups.add(operators_group())
    return user


def sign_in(page, url: str, username: str) -> None:
    page.goto(f"{url}/")
    assert "/accounts/login/" in page.url  # anonymous users only see the sign-in page
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    with page.expect_navigation():
        page.get_by_role("button", name="Log in").click()
    assert page.url == f"{url}/", page.url


TINY = {"model.n_layer": "1", "model.n_embd": "16", "model.n_head": "2",
        "model.block_size": "16", "sync.inner_steps": "4", "sync.fragments": "2",
        "sync.overlap_steps": "1", "sync.min_quorum": "2", "sync.max_staleness": "8",
        "eval.tokens": "256", "eval.interval_steps": "20", "liveness.heartbeat_timeout_s": "3",
        "optim.warmup_steps": "5", "budget.total_tokens": "100000000"}


def create_run_in_the_form(page, url: str, name: str, corpus: Path, shots: Path) -> Run:
    page.goto(f"{url}/runs/new/")
    page.fill("input[name=name]", name)
    for field, value in {**TINY, "data.path": str(corpus)}.items():
        page.fill(f"[name='{field}']", value)
    # The demo preset has four islands; take one out, make the rest small and slow.
    page.locator("tr.island-row").last.get_by_role("button", name="Remove").click()
    assert page.locator("tr.island-row").count() == 3
    for n in range(3):
        page.fill(f"[name='islands-{n}-batch_size']", "2")
        page.fill(f"[name='islands-{n}-speed']", "0.5")
    # The Sizes panel follows the form: the tiny model's 11,616 parameters, 3 islands.
    page.wait_for_function("""() => [...document.querySelectorAll("#estimate-figures dt")]
        .filter((term) => term.textContent.startsWith("island ")).length === 3""")
    page.locator("#estimate-figures").get_by_text(re.compile(r"^11.616 ")).wait_for()
    # and each island's wire per outer step: the fp32 model (46,464 bytes) each way.
    page.wait_for_function("""() => [...document.querySelectorAll("#estimate-wire tbody tr")]
        .map((row) => row.cells[1].textContent).join() === '0.0465,0.0465,0.0465'""")
    page.screenshot(path=shots / "1-form.png", full_page=True)
    with page.expect_navigation():
        page.get_by_role("button", name="Create run").click()
    run = Run.objects.get(name=name)
    assert page.url.endswith(f"/runs/{run.pk}/"), page.url
    return run


def island_state(page, island: str) -> str:
    return page.locator(f"#islands tr[data-island='{island}'] td:nth-child(3)").inner_text()


def link_state(page, island: str) -> str:
    """The state the map draws the island's link to syncd in (run_map.js)."""
    return page.evaluate(f"""document.getElementById('map').data
        .find((t) => t.meta && t.meta.island === '{island}').meta.state""")


LANE = """(island, state) => {
    const chart = document.getElementById('timeline');
    const lane = chart.layout.yaxis.ticktext.indexOf(island);
    return chart.data.filter((t) => t.name === state).flatMap((t) =>
        t.y.map((y, i) => [y, t.hovertext[i]])).filter(([y]) => y === lane).map(([, h]) => h);
}"""


STATE_BARS = """(island) => {
    const chart = document.getElementById('timeline');
    const lane = chart.layout.yaxis.ticktext.indexOf(island);
    return chart.data.filter((t) => t.type === 'bar' && t.offset === -0.3).flatMap((t) =>
        t.y.map((y, i) => [y, t.base[i], t.base[i] + t.x[i]])).filter(([y]) => y === lane)
        .map(([, start, end]) => [start, end]).sort((p, q) => p[0] - q[0]);
}"""


def lane_spans(page, island: str, state: str) -> list[str]:
    """The hover texts of the island's spans in `state` on its timeline lane."""
    return page.evaluate(f"({LANE})('{island}', '{state}')")


def versions(page) -> int:
    text = page.locator("#versions").inner_text()
    return sum(int(v) for v in re.findall(r"\d+", text))


def test_an_operator_runs_breaks_and_heals_a_run_from_the_browser(
        page, control_room, operator, corpus_file, artifacts):
    sign_in(page, control_room, "olga")
    run = create_run_in_the_form(page, control_room, "browser run", corpus_file, artifacts)
    assert page.locator("#run-state").inner_text() == "draft"
    assert run.islands.count() == 3
    page.evaluate("window.notReloaded = true")
    timeline_asks = []
    page.on("request", lambda request: timeline_asks.append(request.url)
            if re.search(r"/api/runs/\d+/timeline", request.url) else None)

    assert page.locator("#run-actions button:visible").all_inner_texts() == ["Start"]
    page.get_by_role("button", name="Start").click()
    page.locator("#run-state", has_text="running").wait_for()
    page.locator("#run-actions button[data-action=start]").wait_for(state="hidden")
    for island in ("us-east-a", "us-east-b", "us-west-a"):
        page.locator(f"#islands tr[data-island='{island}'] .state.training").wait_for(
            timeout=90000)
    page.screenshot(path=artifacts / "2-training.png", full_page=True)
    land = page.locator("#map .layer.land path")
    assert land.count() >= 1 and len(land.first.get_attribute("d")) > 1000  # the world's shapes
    page.wait_for_function("document.getElementById('map').data.some((t) => t.name === "
                           "'us-east-a link' && t.meta.state === 'up')")

    loss_points = "document.getElementById('chart-loss').data[0].x.length"
    before = page.evaluate(loss_points)
    page.wait_for_function(f"{loss_points} > {before} + 3", timeout=30000)
    page.screenshot(path=artifacts / "3-loss-grows.png", full_page=True)

    row = page.locator("#islands tr[data-island='us-east-a']")
    row.locator("button[data-fault=kill]").click()
    page.locator("#toasts", has_text="Kill us-east-a: done").wait_for()
    row.locator(".state.lost").wait_for(timeout=30000)
    page.wait_for_function("document.getElementById('map').data.some((t) => t.name === "
                           "'us-east-a link' && t.meta.state === 'down')")
    assert link_state(page, "us-west-a") == "up"
    page.wait_for_function(f"({LANE})('us-east-a', 'lost').length > 0", timeout=30000)
    # The latest lost span: on a loaded machine an island may also be lost in its start-up.
    assert "kill → lost" in lane_spans(page, "us-east-a", "lost")[-1]
    at_loss = versions(page)
    page.wait_for_function(
        f"[...document.getElementById('versions').textContent.matchAll(/\\d+/g)]"
        f".reduce((s, m) => s + Number(m[0]), 0) >= {at_loss + 4}", timeout=60000)
    assert island_state(page, "us-east-a") == "lost"  # the run moved on without it
    page.screenshot(path=artifacts / "4-lost-run-goes-on.png", full_page=True)

    row.locator("button[data-rejoin]").click()
    row.locator(".state.training").wait_for(timeout=90000)
    page.wait_for_function(f"({LANE})('us-east-a', 'lost').at(-1).includes('first step')",
                           timeout=30000)
    assert link_state(page, "us-east-a") == "up"
    page.screenshot(path=artifacts / "5-rejoined.png", full_page=True)
    # The page had its lanes from its render and asked only for what was new after.
    assert len(timeline_asks) >= 2
    assert all(re.search(r"\?since=\d+(\.\d+)?$", url) for url in timeline_asks), timeline_asks
    spans = page.evaluate(f"({STATE_BARS})('us-east-a')")
    assert len(spans) >= 4  # training, lost, rejoining, ... training again
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert abs(start - end) < 1, spans  # joined across fetches: no overlap, no gap

    events = page.locator("#events")
    for kind in ("fault", "island_lost", "rejoin", "merge"):
        assert events.locator(f"li[data-kind='{kind}']").count() >= 1, kind
    assert page.evaluate("window.notReloaded") is True  # all of it live, no reload


def test_a_run_name_with_html_in_it_is_shown_as_text(page, control_room, operator, corpus_file,
                                                      artifacts):
    sign_in(page, control_room, "olga")
    name = "<img src=x onerror=alert(1)><b>bold</b>"
    run = create_run_in_the_form(page, control_room, name, corpus_file, artifacts)

    assert page.locator("#run-name").inner_text() == name
    assert page.locator("#run-name b, #run-name img").count() == 0
    page.goto(f"{control_room}/")
    assert page.locator(f"#runs tr[data-run='{run.pk}'] td a").inner_text() == name
    page.screenshot(path=artifacts / "escaped.png", full_page=True)


def test_a_bad_setting_shows_its_message_beside_the_field_and_saves_nothing(
        page, control_room, operator, corpus_file, artifacts):
    sign_in(page, control_room, "olga")
    page.goto(f"{control_room}/runs/new/")
    page.fill("input[name=name]", "too many quorum")
    page.fill("[name='sync.min_quorum']", "9")
    page.get_by_role("button", name="Create run").click()
    message = page.locator("[id='field-sync.min_quorum'] .errorlist")
    message.wait_for()
    assert "number of islands (4)" in message.inner_text()
    page.screenshot(path=artifacts / "field-error.png", full_page=True)
    assert not Run.objects.filter(name="too many quorum").exists()


def test_the_map_the_islands_and_the_quorum_fit_one_screen_with_eight_islands(
        page, control_room, operator, artifacts):
    regions = ("us-east", "us-east", "us-central", "us-central", "us-west", "us-west",
               "us-south", "us-south")
    run = create_run(name="eight islands", mode="decoupled", user=operator, config={
        "sync": {"min_quorum": 2, "fragments": 4},
        "islands": [{"name": f"{region}-{n}", "region": region}
                    for n, region in enumerate(regions)]})
    sign_in(page, control_room, "olga")
    page.goto(f"{control_room}/runs/{run.pk}/")
    page.locator("#map .layer.land path").first.wait_for(state="attached")
    assert page.locator("#islands tbody tr").count() == 8
    assert page.locator("#quorum tbody tr").count() == 4
    page.screenshot(path=artifacts / "1440x900.png")
    for part in ("#map", "#islands", "#quorum", "#islands tbody tr:last-child button[data-rejoin]"):
        box = page.locator(part).bounding_box()
        assert box["y"] + box["height"] <= 900 and box["x"] + box["width"] <= 1440, part

    page.set_viewport_size({"width": 1024, "height": 768})
    page.wait_for_timeout(500)
    page.screenshot(path=artifacts / "1024.png", full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1024  # no sideways scroll
    kill = page.locator("#islands tbody tr:first-child button[data-fault=kill]").bounding_box()
    assert kill["x"] + kill["width"] <= 1024  # every island's actions still in view


def island_status(region: str, version_lag: int, ages: dict) -> dict:
    """A whole island of syncd's status (syncd.records.IslandStatus), training."""
    return {"region": region, "epoch": 1, "state": "training", "fault": "none",
            "heartbeat_age_s": 0.4, "tokens": 4096, "inner_steps": 64, "loss": 3.1,
            "bytes_up": 1000, "bytes_down": 1000, "emulated_bytes_up": 1000.0,
            "emulated_bytes_down": 1000.0, "tokens_per_s": 900.0, "step_time_s": 0.02,
            "cpu_share": 0.2, "backpressure_wait_s": 0.0, "slot_wait_s": 0.0,
            "version_lag": version_lag, "rejoin_warm": False, "rejections": 0,
            "staleness": ages, "goodput": 0.9, "overcredited": False,
            "link": {"state": "up", "bytes_up": 0.0, "bytes_down": 0.0}}


def test_the_run_page_shows_each_islands_staleness_and_held_out_loss_against_tokens(
        page, control_room, operator, redis_url, artifacts):
    from django.utils import timezone

    from syncd.connection import connect
    from syncd.records import IslandStatus, fields
    from syncd.store import RunStore
    from webapp.runs.models import Metric

    run = create_run(name="ages", mode="decoupled", user=operator, config={
        "sync": {"min_quorum": 2}, "islands": [
            {"name": "waits", "region": "us-east"}, {"name": "keeps-up", "region": "us-east"},
            {"name": "straggler", "region": "us-west"}]})
    # Two evaluations in the history, a third in the status: the chart has all three.
    Metric.objects.bulk_create([Metric(run=run, time=timezone.now(), tokens=t, outer_steps=1,
                                       eval_loss=loss, eval_tokens=t, eval_bpb=loss / 0.693)
                                for t, loss in ((1000, 4.0), (2000, 3.5))])
    islands = {"waits": island_status("us-east", 1, {"last": 1, "p50": 0.0, "p95": 1.0,
                                                      "max": 1, "count": 40}),
               "keeps-up": island_status("us-east", 0, {"last": 0, "p50": 0.0, "p95": 1.0,
                                                         "max": 1, "count": 40}),
               "straggler": island_status("us-west", 19, {"last": 19, "p50": 18.0,
                                                          "p95": 19.9, "max": 20,
                                                          "count": 3})}
    assert all(island.keys() == fields(IslandStatus).keys() for island in islands.values())
    RunStore(connect(redis_url), run.pk).put_status({
        "run": run.pk, "time": timezone.now().timestamp(), "alive_islands": 3, "goodput": 0.9,
        "overcredited": [], "uptime": 1.0, "train_loss": 3.1, "startup_s": 2.0,
        "theta_s": 1.0, "max_stall_s": 0.5, "lost_s": {}, "versions": [40, 40],
        "outer_steps": 40, "tokens_merged": 4000, "eval_loss": 3.25, "eval_tokens": 3000,
        "eval_bpb": 4.689, "staleness": {"p50": 0.0, "p95": 2.0, "max": 20, "count": 83},
        "islands": islands, "fragments": []})
    sign_in(page, control_room, "olga")
    page.goto(f"{control_room}/runs/{run.pk}/")

    def lag(island: str):
        return page.locator(f"#islands tr[data-island='{island}'] td").nth(7)

    page.wait_for_function("document.querySelector(\"#islands tr[data-island='straggler'] "
                           "td:nth-child(8)\").textContent.includes('·')")
    # version lag · p95 of the ages of its merged updates; the rest in its tooltip
    assert lag("straggler").inner_text() == "19 · 19.9"
    assert "max 20 over 3 merges" in lag("straggler").get_attribute("title")
    assert lag("waits").inner_text() == "1 · 1.0"
    assert "max 1 over 40 merges" in lag("waits").get_attribute("title")
    assert page.locator("#eval-bpb").inner_text() == "4.689"
    chart = "document.getElementById('chart-eval').data[0]"
    page.wait_for_function(f"{chart}.x.length === 3")
    assert page.evaluate(f"[{chart}.x, {chart}.y]") == [[1000, 2000, 3000], [4.0, 3.5, 3.25]]
    page.screenshot(path=artifacts / "ages-and-eval.png", full_page=True)


def fill_field(page, field: str, value: str) -> None:
    element = page.locator(f"[name='{field}']")
    if element.evaluate("(e) => e.tagName") == "SELECT":
        element.select_option(value)
    else:
        element.fill(value)


def test_a_llama_from_a_config_folder_on_a_trained_bpe_from_the_browser_exports_the_loss_shown(
        page, control_room, operator, tmp_path, artifacts):
    import io
    import json
    import zipfile

    from bench.models import held_out_loss
    from diloco.data import run_corpus
    from syncd.environment import data_dir
    from tests.diloco.test_hf import TINY_LLAMA

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i}: island {i % 5} trains "
                                          f"the model and merges {i % 11} updates."}) + "\n"
                              for i in range(1500)) + "{not json\n")
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps(
        {**{k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"},
         "architectures": ["LlamaForCausalLM"]}))
    sign_in(page, control_room, "olga")
    page.goto(f"{control_room}/runs/new/")
    page.fill("input[name=name]", "llama")
    for field, value in {**TINY, "model.source": "hf", "model.hf_config": str(llama),
                         "data.path": str(corpus), "data.tokenizer": "train",
                         "data.vocab_size": "320"}.items():
        fill_field(page, field, value)
    page.locator("tr.island-row").last.get_by_role("button", name="Remove").click()
    for n in range(3):
        page.fill(f"[name='islands-{n}-batch_size']", "2")
        page.fill(f"[name='islands-{n}-speed']", "0.5")
    with page.expect_navigation():
        page.get_by_role("button", name="Create run").click()
    run = Run.objects.get(name="llama")
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Start").click()
    for island in ("us-east-a", "us-east-b", "us-west-a"):
        page.locator(f"#islands tr[data-island='{island}'] .state.training").wait_for(
            timeout=120000)
    row = page.locator("#islands tr[data-island='us-east-a']")
    row.locator("button[data-fault=kill]").click()
    row.locator(".state.lost").wait_for(timeout=30000)
    row.locator("button[data-rejoin]").click()
    row.locator(".state.training").wait_for(timeout=90000)
    page.locator("#events li[data-kind='alert']", has_text="1 not JSON").wait_for()
    page.get_by_role("button", name="Stop").click()
    page.locator("#run-state", has_text="stopped").wait_for(timeout=90000)
    page.reload()  # the stopped run's page: its final evaluation and checkpoint
    page.wait_for_function("document.getElementById('eval-loss').title !== ''")
    shown = float(page.locator("#eval-loss").get_attribute("title"))
    page.screenshot(path=artifacts / "llama-stopped.png", full_page=True)

    with page.expect_download() as download:
        page.locator("#checkpoints tbody tr").last.locator("a[data-hf]").click()
    folder = tmp_path / "export"
    zipfile.ZipFile(io.BytesIO(Path(download.value.path()).read_bytes())).extractall(folder)
    prepared = Path(run_corpus(run.run_config().data, data_dir()).folder)
    assert held_out_loss(folder, prepared, 256, 16) == pytest.approx(
        shown, abs=1e-4)
