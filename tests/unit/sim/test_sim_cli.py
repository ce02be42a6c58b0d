"""`crescent sim` writes the issue's JSON form and refuses bad input with a message, not a
traceback."""

import json

import pytest

from crescent.cli.main import build_parser

KEYS = [
    "case",
    "requests",
    "completed",
    "rejected",
    "hit_rate",
    "mean_ttft_s",
    "p90_ttft_s",
    "mean_tbt_s",
    "p90_tbt_s",
    "effective_capacity",
    "prefill_compute_s",
    "prefilled_on_decode",
    "max_replicas",
    "wall_s",
]


def crescent(*argv):
    args = build_parser().parse_args([str(a) for a in argv])
    return args.run(args)


def trace_file(tmp_path, lines):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_sim_writes_every_case_field(tmp_path, capsys):
    path = trace_file(
        tmp_path,
        [
            {
                "timestamp": i * 100,
                "input_length": 1500,
                "output_length": 5,
                "hash_ids": [1, 2, 3 + i],
            }
            for i in range(6)
        ],
    )
    out = tmp_path / "out" / "sim.json"
    assert crescent("sim", "--trace", path, "--prefill", 2, "--decode", 2, "--json", out) == 0
    result = json.loads(out.read_text())
    assert result["bench"] == "sim"
    [case] = result["cases"]
    assert list(case)[: len(KEYS)] == KEYS
    assert case["requests"] == case["completed"] == 6 and case["rejected"] == 0
    assert case["hit_rate"] == pytest.approx(5 * 1024 / (6 * 1500))
    assert "kv-centric/none" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "kv-centric", "--cache-scope", "local"], "local cache scope forbids"),
        (["--speed", "0"], "speed"),
        (["--ttft-slo-s", "-1"], "SLOs must be > 0"),
    ],
)
def test_sim_refuses_a_bad_configuration_with_a_message(tmp_path, capsys, argv, message):
    path = trace_file(
        tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}]
    )
    assert crescent("sim", "--trace", path, *argv) == 2
    assert message in capsys.readouterr().err


def test_sim_names_the_bad_trace_line(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1}\n'
    )
    assert crescent("sim", "--trace", path) == 2
    assert f"{path}:2: missing field 'input_length'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["fig17", "table4"])
def test_an_experiment_writes_its_json_and_png(tmp_path, name):
    path = trace_file(
        tmp_path,
        [
            {
                "timestamp": i * 50,
                "input_length": 3000,
                "output_length": 20,
                "hash_ids": [1, 2, 3, 4, 5, 10 + i],
            }
            for i in range(20)
        ],
    )
    assert (
        crescent(
            "sim", "experiment", name, "--trace", path, "--out", tmp_path / "out", "--speed", "2"
        )
        == 0
    )
    result = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert result["bench"] == f"sim-{name}" and result["speed"] == 2.0
    assert [c["case"] for c in result["cases"]] == (
        ["local", "global"] if name == "fig17" else ["baseline", "early", "predictive"]
    )
    assert (tmp_path / "out" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
