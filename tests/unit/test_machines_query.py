"""The Machines window's queries and their reading, against answers a real Prometheus gave
(recorded from two real engines, served again over a real socket) and against servers that do
not answer as Prometheus does."""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from tests.prometheus_answers import (
    AnswerServer,
    closed_port,
    fleet_answers,
    json_answer,
    recorded,
    silent_port,
)
from trayapp.ui.machines_query import (
    SERIES_QUERY,
    UP_QUERY,
    Fleet,
    PrometheusError,
    fetch_fleet,
    instant_query,
    query_url,
)
from trayapp.ui.machines_text import job_cells, machine_cells, status_line


@pytest.fixture(scope="module")
def fleet_data() -> Dict[str, Any]:
    return recorded("fleet")


@pytest.fixture(scope="module")
def fleet(fleet_data: Dict[str, Any]) -> Fleet:
    with AnswerServer(fleet_answers(fleet_data)) as server:  # type: ignore[arg-type]
        result = fetch_fleet(server.url)
        assert {q for _p, q in server.queries} == {SERIES_QUERY, UP_QUERY}
        return result


def test_the_query_url_keeps_a_path_prefix_and_encodes_the_query() -> None:
    assert query_url("http://prom:9090", 'up{job="x"}') == \
        "http://prom:9090/api/v1/query?query=up%7Bjob%3D%22x%22%7D"
    assert query_url("https://lab.example/prometheus/", "up").startswith(
        "https://lab.example/prometheus/api/v1/query?")
    with pytest.raises(PrometheusError, match="not an http"):
        query_url("prom:9090", "up")


def test_each_machine_has_the_values_its_engine_gave(fleet: Fleet,
                                                     fleet_data: Dict[str, Any]) -> None:
    statuses = fleet_data["status"]
    answering = [m for m in fleet.machines if m.up]
    assert sorted(m.instance for m in answering) == sorted(statuses)
    for m in answering:
        status = statuses[m.instance]
        assert m.ram_total_bytes == status["memory"]["total_bytes"]
        assert m.guard == status["guard"]["state"]
        assert m.version and m.host
        assert [(g.index, g.name, g.total_bytes) for g in m.gpus] == \
            [(str(g["index"]), g["name"], g["memory_total_bytes"]) for g in status["gpus"]]
        assert [(j.id, j.name, j.state) for j in m.jobs] == \
            [(j["id"], j["name"], j["state"]) for j in status["jobs"]]
    with_gpus = [m for m in answering if m.gpus]
    assert len(with_gpus) == 1 and len(with_gpus[0].gpus) == 2
    job = with_gpus[0].jobs[0]
    assert job.ram_bytes and job.ram_bytes > 10 * 2**20
    assert job.progress_ratio is not None and 0.25 <= job.progress_ratio < 1
    assert job.vram_bytes == 0  # a CPU-only job on the simulated GPUs holds none


def test_a_machine_that_stopped_answering_is_listed_as_such(fleet: Fleet) -> None:
    down = [m for m in fleet.machines if m.up is False]
    assert len(down) == 1
    assert down[0].ram_total_bytes is None and down[0].guard is None
    assert machine_cells(down[0])[1:4] == ["n/a", "n/a", "not answering"]
    assert "1 not answering" in status_line(fleet.url, fleet, None, 5)


def test_the_rows_read_as_a_user_reads_them(fleet: Fleet) -> None:
    gpu_machine = next(m for m in fleet.machines if m.gpus)
    cells = machine_cells(gpu_machine)
    assert cells[1].endswith("%)") and " available of " in cells[1]
    assert " used of " in cells[2]
    assert cells[3] == "ok" and cells[4] == "1 job"
    job = job_cells(gpu_machine.jobs[0])
    assert job[0].startswith("mnist-small (job ") and job[3] == "running"
    assert job[4].endswith("% done")
    no_gpu = next(m for m in fleet.machines if m.up and not m.gpus)
    assert machine_cells(no_gpu)[2] == "no GPU" and machine_cells(no_gpu)[4] == "none"
    line = status_line(fleet.url, fleet, None, 5)
    assert line.startswith("3 machines, 1 not answering, from Prometheus at ")


def test_an_empty_prometheus_says_what_to_check() -> None:
    empty = recorded("empty")
    with AnswerServer(fleet_answers(empty)) as server:  # type: ignore[arg-type]
        fleet = fetch_fleet(server.url)
    assert fleet.machines == ()
    line = status_line(server.url, fleet, None, 5)
    assert "no machine running Headroom" in line and "[metrics] listen" in line


def test_a_refused_query_gives_prometheus_own_reason() -> None:
    refused = recorded("refused")
    with AnswerServer({None: json_answer(refused["answer"], refused["http_status"])}) as server:
        with pytest.raises(PrometheusError) as e:
            instant_query(server.url, "up{")
    assert str(e.value).startswith("it refused the query: invalid parameter")
    assert "\n" not in str(e.value)


def test_no_server_at_the_port_says_it_cannot_be_reached() -> None:
    with pytest.raises(PrometheusError, match=r"^cannot reach it: .*[Cc]onnection refused"):
        fetch_fleet(f"http://127.0.0.1:{closed_port()}")


def test_a_server_that_never_answers_is_given_up_on() -> None:
    with silent_port() as port:
        with pytest.raises(PrometheusError, match=r"no answer within 0.5 s|timed out"):
            fetch_fleet(f"http://127.0.0.1:{port}", timeout=0.5)


@pytest.mark.parametrize("answer, words", [
    ((200, "text/html", b"<html>Grafana</html>"), "is not JSON: is this the address"),
    ((404, "text/plain", b"404 page not found\n"), "(HTTP 404) is not JSON"),
    (json_answer([1, 2]), "not a Prometheus answer"),
    (json_answer({"status": "success", "data": {"resultType": "matrix", "result": []}}),
     "not an instant vector"),
    (json_answer({"status": "success", "data": {"resultType": "vector",
                                                "result": [{"metric": {}, "value": [1, "x"]}]}}),
     "not a number"),
    (json_answer({"status": "success", "data": {"resultType": "vector",
                                                "result": [{"value": [1, "1"]}]}}),
     "without labels"),
    (json_answer({"status": "error"}, 503), "it refused the query: HTTP 503"),
])
def test_an_answer_that_is_not_a_prometheus_vector_is_named(answer: Any, words: str) -> None:
    with AnswerServer({None: answer}) as server:
        with pytest.raises(PrometheusError) as e:
            fetch_fleet(server.url)
    assert words in str(e.value)


def test_not_a_number_is_none_never_zero(fleet_data: Dict[str, Any]) -> None:
    series = json.loads(json.dumps(fleet_data["series"]))
    for s in series["data"]["result"]:
        if s["metric"]["__name__"] == "headroom_memory_available_bytes":
            s["value"][1] = "NaN"
    with AnswerServer({SERIES_QUERY: json_answer(series),
                       UP_QUERY: json_answer(fleet_data["up"])}) as server:
        fleet = fetch_fleet(server.url)
    answering = [m for m in fleet.machines if m.up]
    assert answering and all(m.ram_available_bytes is None for m in answering)
    assert machine_cells(answering[0])[1] == "n/a"
