import json

import pytest

from conftest import DATA
from llamadecide.calibration.compare import compare, read_records
from llamadecide.calibration.data import TASKS_DIR, load_task, read_labelled
from llamadecide.errors import InvalidRequestError


def test_read_headerless_tsv_by_index(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("first text\tWorld\nsecond\tSports\n")
    items = read_labelled(path, text_column="0", label_column="1")
    assert [(i.text, i.label) for i in items] == [("first text", "World"), ("second", "Sports")]


def test_read_csv_and_jsonl_by_name(tmp_path):
    csv_path = tmp_path / "d.csv"
    csv_path.write_text('text,category\n"a, quoted",x\nb,y\n')
    assert [i.text for i in read_labelled(csv_path, text_column="text", label_column="category")] == ["a, quoted", "b"]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(json.dumps({"id": "q1", "msg": "hi", "gold": "y"}) + "\n")
    item = read_labelled(jsonl, text_column="msg", label_column="gold")[0]
    assert (item.id, item.text, item.label) == ("q1", "hi", "y")
    with pytest.raises(InvalidRequestError, match="no column 'body'"):
        read_labelled(csv_path, text_column="body", label_column="category")


def test_example_tasks_map_every_data_label():
    agnews = load_task(TASKS_DIR / "agnews.yaml")
    labels = {i.label for i in read_labelled(DATA / "agnews" / "test.tsv", text_column="0", label_column="1")}
    assert sorted(agnews.gold_index(label) for label in labels) == [0, 1, 2, 3]
    sst2 = load_task(TASKS_DIR / "sst2.yaml")
    assert (sst2.gold_index("1"), sst2.gold_index("0")) == (0, 1)
    banking = load_task(TASKS_DIR / "banking77.yaml")
    rows = read_labelled(DATA / "banking77" / "test.csv", text_column="text", label_column="category")
    assert len({banking.gold_index(r.label) for r in rows}) == 77
    phrases = load_task(TASKS_DIR / "banking77-phrases.yaml")  # the same intents, shown as plain phrases
    assert [phrases.gold_index(r.label) for r in rows] == [banking.gold_index(r.label) for r in rows]
    assert phrases.options[banking.gold_index("card_arrival")] == "card arrival"
    assert phrases.options[banking.gold_index("Refund_not_showing_up")] == "refund not showing up"


def test_unmapped_label_is_named():
    task = load_task(TASKS_DIR / "agnews.yaml")
    with pytest.raises(InvalidRequestError, match="'Weather'"):
        task.gold_index("Weather")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_compare_agreement_flips_kl_and_accuracy(tmp_path):
    base = {"options": ["a", "b"]}
    _write(
        tmp_path / "a.jsonl",
        [
            {**base, "id": "1", "label": 0, "probabilities": [0.9, 0.1]},
            {**base, "id": "2", "label": 1, "probabilities": [0.6, 0.4]},
            {**base, "id": "3", "label": 1, "probabilities": [0.2, 0.8]},
        ],
    )
    _write(
        tmp_path / "b.jsonl",
        [
            {**base, "id": "1", "label": 0, "probabilities": [0.9, 0.1]},
            {**base, "id": "2", "label": 1, "probabilities": [0.3, 0.7]},
            {**base, "id": "4", "label": 1, "probabilities": [0.5, 0.5]},
        ],
    )
    result = compare(read_records(tmp_path / "a.jsonl"), read_records(tmp_path / "b.jsonl"))
    assert result["matched"] == 2 and result["agreement"] == 0.5 and result["flip_rate"] == 0.5
    kl_item_2 = 0.6 * __import__("math").log(0.6 / 0.3) + 0.4 * __import__("math").log(0.4 / 0.7)
    assert result["mean_kl_a_b"] == pytest.approx(kl_item_2 / 2)
    assert (result["accuracy_a"], result["accuracy_b"], result["accuracy_change"]) == (0.5, 1.0, 0.5)
    assert result["flips"] == [{"key": "2", "a": "a", "b": "b", "p_a": 0.6, "p_b": 0.7, "label": "b"}]


def test_compare_skips_a_torn_last_line_and_names_a_bad_line_elsewhere(tmp_path, caplog):
    base = {"options": ["a", "b"], "label": 0}
    rows = [{**base, "id": str(i), "probabilities": [0.7, 0.3]} for i in range(3)]
    whole = "".join(json.dumps(r) + "\n" for r in rows)
    torn = tmp_path / "torn.jsonl"
    torn.write_text(whole + json.dumps({**base, "id": "9", "probabilities": [0.5, 0.5]})[:40])  # as kill -9 leaves it
    with caplog.at_level("WARNING"):
        assert sorted(read_records(torn)) == ["0", "1", "2"]
    assert "torn last line 4" in caplog.text
    broken = tmp_path / "broken.jsonl"
    lines = whole.splitlines()
    broken.write_text("\n".join([lines[0], lines[1][:30], lines[2]]) + "\n")
    with pytest.raises(InvalidRequestError, match=r"broken.jsonl, line 2: not a JSON record"):
        read_records(broken)


def test_task_options_named_yes_no_on_off_stay_text(tmp_path):
    """YAML 1.1 reads yes/no/on/off as booleans; an intent set with intents of those names keeps them as words."""
    path = tmp_path / "intents.yaml"
    path.write_text(
        "type: choice\ninstructions: Which intent?\noptions: [yes, no, on, off, other]\n"
        "labels: {affirm: yes, deny: no}\n"
    )
    task = load_task(path)
    assert task.options == ["yes", "no", "on", "off", "other"]
    assert task.gold_index("affirm") == 0 and task.gold_index("deny") == 1 and task.gold_index("on") == 2
    assert [o.value for o in task.question().options] == ["yes", "no", "on", "off", "other"]
