"""Bad training input refused before it costs anything: the data set checked once in training_setup (integer ids
inside the vocabulary, labels of matching length, a label to learn, one example a row), training_setup's own
keywords, and peft's errors translated at the boundary with the model's layer names. CPU, tiny models."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import cudaload
from cudaload.errors import ConfigurationError, CudaloadWarning
from cudaload.planner import plan
from cudaload.plans.plan import Plan
from cudaload.profiles import hardware
from cudaload.testing import full_config, tiny_config
from cudaload.train.arguments import vocab_bound
from cudaload.train.data import check_ids, pack

Q8 = full_config("Qwen3-8B")
VOCAB = 151936  # Qwen3-8B's config


def h200() -> Any:
    return hardware("H200").with_packages(["peft", "flash-attn-4"], [])


@pytest.fixture(scope="module")
def packed() -> Plan:
    p = plan(Q8, hardware=h200(), intent="lora", seq_len=64, batch_size=4)
    assert p.training is not None and p.training.packed and p.model.vocab_size == VOCAB
    return p


@pytest.fixture(scope="module")
def padded() -> Plan:
    p = plan(Q8, hardware=h200(), intent="lora", seq_len=64, batch_size=4, batch_layout="padded")
    assert p.training is not None and not p.training.packed
    return p


def _rows(n: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(0, 1000) for _ in range(rng.randrange(2, 60))]} for _ in range(n)]


def _refused(p: Any, data: Any, *match: str, **kw: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as e:
        cudaload.training_setup(p, data, **kw)
    text = str(e.value)
    for m in match:
        assert m in text, text
    assert e.value.fix
    return e.value


# -- token ids ----------------------------------------------------------------------------------------------------


def test_float_ids_are_refused_even_whole_ones_naming_the_row_and_column(packed: Plan) -> None:
    rows = _rows(5)
    rows[3] = {"input_ids": [5.0, 6.0, 7.0]}
    e = _refused(packed, rows, "example 3", "'input_ids'", "5.0", "whole number")
    assert "cast the ids to int" in (e.fix or "")
    _refused(packed, [*_rows(2), {"input_ids": [5, 6.7]}], "example 2", "position 1", "6.7")
    # tensors and arrays: their dtype says it, without reading them
    _refused(packed, [{"input_ids": torch.tensor([5.0, 6.0])}], "example 0", "torch.float32")
    _refused(packed, [{"input_ids": np.array([5.0, 6.0])}], "example 0", "float64")
    _refused(packed, [{"input_ids": [1, 2], "labels": [1.0, 2.0]}], "example 0", "'labels'", "float")


def test_out_of_vocabulary_and_negative_ids_are_refused_before_the_forward(
    packed: Plan, padded: Plan
) -> None:
    for p in (packed, padded):
        rows = _rows(6)
        rows[4] = {"input_ids": [5, 6, VOCAB]}
        e = _refused(p, rows, "example 4", "'input_ids'", "position 2", f"token id {VOCAB}", f"[0, {VOCAB})")
        assert "resize_token_embeddings" in (e.fix or "")
        rows[4] = {"input_ids": torch.tensor([5, -1, 7])}
        e = _refused(p, rows, "example 4", "position 1", "token id -1 is negative")
        assert "attention_mask 0" in (e.fix or "") and "pad_token_id" in (e.fix or "")
    # -100 is a label, never an input id
    _refused(packed, [{"input_ids": [5, -100]}], "token id -100 is negative")


def test_padding_the_attention_mask_drops_may_hold_any_id(packed: Plan) -> None:
    rows = [{"input_ids": [-1, -1, 5, 6, 7], "attention_mask": [0, 0, 1, 1, 1]}]
    ds = cudaload.training_setup(packed, rows).train_dataset
    assert ds[0]["input_ids"] == [[5, 6, 7]]
    # a boolean mask, as a tensor, works the same
    rows = [{"input_ids": torch.tensor([-1, 5, 6]), "attention_mask": torch.tensor([False, True, True])}]
    assert cudaload.training_setup(packed, rows).train_dataset[0]["input_ids"] == [[5, 6]]


def test_the_bound_is_the_models_input_embeddings_where_they_differ_from_the_config(tiny_model: Any) -> None:
    from transformers import AutoModelForCausalLM

    path = tiny_model("qwen3")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    p = plan(str(path), intent="lora", seq_len=64, batch_size=2)
    config_vocab = model.config.vocab_size
    assert vocab_bound(p, p) == config_vocab == p.model.vocab_size
    model.resize_token_embeddings(config_vocab + 8)  # tokens added to the tokenizer
    model.config.vocab_size = config_vocab  # a config that still says the old size
    model.cudaload_plan = p
    assert vocab_bound(model, p) == config_vocab + 8
    rows = [{"input_ids": [1, config_vocab + 7]}, {"input_ids": [2, 3]}]
    assert len(cudaload.training_setup(model, rows).train_dataset) >= 1
    _refused(model, [{"input_ids": [1, config_vocab + 8]}], "example 0", f"[0, {config_vocab + 8})")
    # against the plan alone, the config's bound
    _refused(p, rows, "example 0", f"token id {config_vocab + 7}")


# -- labels -------------------------------------------------------------------------------------------------------


def test_labels_of_another_length_or_outside_the_vocabulary_are_refused(packed: Plan, padded: Plan) -> None:
    for p in (packed, padded):
        rows = _rows(4)
        rows[2] = {"input_ids": [5, 6, 7], "labels": [5, 6]}
        _refused(p, rows, "example 2", "2 labels for 3 input_ids")
        rows[2] = {"input_ids": [5, 6, 7], "attention_mask": [1, 1]}
        _refused(p, rows, "example 2", "attention_mask has 2 entries for 3")
        rows[2] = {"input_ids": [5, 6, 7], "labels": [-100, 6, -1]}
        _refused(p, rows, "example 2", "'labels'", "position 2", "label -1 is neither")
        rows[2] = {"input_ids": [5, 6, 7], "labels": [-100, VOCAB, 7]}
        _refused(p, rows, "example 2", "position 1", f"label {VOCAB}")


def test_no_label_to_learn_is_refused_and_a_notable_share_without_one_is_warned(packed: Plan) -> None:
    rows = [{"input_ids": r["input_ids"], "labels": [-100] * len(r["input_ids"])} for r in _rows(10)]
    e = _refused(packed, rows, "no example has a label to learn", "nan")
    assert "label masking" in (e.fix or "")
    # a first label alone is no target (the model predicts token t+1 from the tokens up to t)
    first_only = [{"input_ids": [5, 6], "labels": [5, -100]}]
    _refused(packed, first_only, "no example has a label to learn")
    # single tokens without labels teach nothing either
    _refused(packed, [{"input_ids": [5]}, {"input_ids": [6]}], "no example has a label to learn")
    # truncation that cut every answer off says so
    cut = [{"input_ids": list(range(100)), "labels": [-100] * 80 + list(range(80, 100))}]
    _refused(packed, cut, "truncate=True may have cut", truncate=True)
    good = _rows(10)
    with pytest.warns(CudaloadWarning, match=r"3 of 13 examples \(23%\) have no label to learn"):
        cudaload.training_setup(packed, [*good, *rows[:3]])


def test_a_good_data_set_passes_unchanged_without_a_warning(packed: Plan, padded: Plan) -> None:
    """The same packed steps as before the checks: seeded order, a step closed when a bound would break."""
    assert packed.training is not None
    t = packed.training.step
    rows = _rows(80, seed=3)
    for r in rows[::3]:  # some with labels, masked prompts and a padded attention mask
        n = len(r["input_ids"])
        r["labels"] = [-100] * (n // 2) + r["input_ids"][n // 2 :]
        r["attention_mask"] = [1] * n
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = cudaload.training_setup(packed, rows, seed=7)
        as_tensors = cudaload.training_setup(
            packed, [{k: torch.tensor(v) for k, v in r.items()} for r in rows], seed=7
        )
        as_arrays = cudaload.training_setup(
            packed, [{k: np.array(v, dtype=np.int64) for k, v in r.items()} for r in rows], seed=7
        )
        rows_out = cudaload.training_setup(padded, rows).train_dataset
    order = list(range(len(rows)))
    random.Random(7).shuffle(order)
    expected: list[list[int]] = [[]]
    for i in order:
        step = expected[-1]
        if step and (
            len(step) >= t.sequences
            or sum(len(rows[j]["input_ids"]) for j in step) + len(rows[i]["input_ids"]) > t.tokens
        ):
            expected.append([])
        expected[-1].append(i)
    got = list(s.train_dataset)
    assert [item["input_ids"] for item in got] == [[rows[i]["input_ids"] for i in step] for step in expected]
    assert [item["labels"] for item in got] == [
        [rows[i].get("labels", rows[i]["input_ids"]) for i in step] for step in expected
    ]
    assert list(as_tensors.train_dataset) == got == list(as_arrays.train_dataset)
    assert [r["input_ids"] for r in rows_out] == [r["input_ids"] for r in rows]


# -- one example a row --------------------------------------------------------------------------------------------


def test_a_datasetdict_gets_its_split_named(packed: Plan) -> None:
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(_rows(4)),
            "test": datasets.Dataset.from_list(_rows(2)),
        }
    )
    e = _refused(packed, dd, "DatasetDict of splits ('train', 'test')")
    assert e.fix == "pass dataset['train']"
    assert len(cudaload.training_setup(packed, dd["train"]).train_dataset) >= 1
    only = datasets.DatasetDict({"validation": datasets.Dataset.from_list(_rows(2))})
    assert _refused(packed, only, "'validation'").fix == "pass dataset['validation']"


def test_a_columnar_dict_or_a_tokenizers_batch_gets_what_to_pass(packed: Plan) -> None:
    rows = _rows(4)
    columns = {"input_ids": [r["input_ids"] for r in rows]}
    e = _refused(packed, columns, "dict of columns ('input_ids'")
    assert "datasets.Dataset.from_dict(data)" in (e.fix or "")
    # the fix's list form works as written
    data = columns
    fixed = [dict(zip(data, row, strict=True)) for row in zip(*data.values(), strict=True)]
    assert len(cudaload.training_setup(packed, fixed).train_dataset) >= 1
    from transformers import BatchEncoding

    batch = BatchEncoding({"input_ids": [[5, 6], [7, 8, 9]], "attention_mask": [[1, 1], [1, 1, 1]]})
    _refused(packed, batch, "dict of columns", "batch output")
    assert _refused(packed, {"input_ids": [5, 6, 7]}, "one example").fix == "pass a list: [example]"
    _refused(packed, {"text": ["a", "b"]}, "without 'input_ids'")


def test_torch_data_sets_and_a_generator_keep_working(packed: Plan) -> None:
    rows = _rows(12, seed=5)

    class MapStyle(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.tensor(rows[i]["input_ids"])}

    class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(rows)

    want = list(cudaload.training_setup(packed, rows, seed=1).train_dataset)
    for data in (MapStyle(), Stream(), (r for r in rows)):
        assert list(cudaload.training_setup(packed, data, seed=1).train_dataset) == want
    bad = [*rows[:3], {"input_ids": [5, VOCAB + 1]}]
    _refused(packed, (r for r in bad), "example 3", f"token id {VOCAB + 1}")


def test_a_dataframe_gets_its_rows_named() -> None:
    pd = pytest.importorskip("pandas")
    p = plan(Q8, hardware=h200(), intent="lora", seq_len=64, batch_size=4)
    e = _refused(p, pd.DataFrame({"input_ids": [[5, 6], [7, 8]]}), "DataFrame")
    assert "df.to_dict('records')" in (e.fix or "")


def test_text_instead_of_token_ids_gets_the_tokenizer_call(packed: Plan) -> None:
    for data, match in (
        ("a whole text", "the data set is text"),
        (["first text", "second"], "example 0 is text"),
        ([{"text": "hello"}], "only text"),
        ([{"input_ids": "hello"}], "is text ('hello')"),
    ):
        e = _refused(packed, data, match)
        assert "tokenizer(" in (e.fix or ""), data
    e = _refused(packed, [{"input_ids": ["hel", "lo"]}], "position 0", "token string")
    assert "convert_tokens_to_ids" in (e.fix or "")
    _refused(packed, [{"input_ids": [[5, 6], [7]]}], "nested")
    _refused(packed, [{"input_ids": torch.tensor([[5, 6, 7]])}], "nested", "return_tensors")


def test_an_empty_data_set_or_empty_rows(packed: Plan) -> None:
    _refused(packed, [], "the data set is empty")
    _refused(packed, [{"input_ids": []}, {"input_ids": []}], "no non-empty example: all 2 have no token")
    with pytest.warns(CudaloadWarning, match=r"1 of 5 examples are empty \(example 2 is the first\)"):
        s = cudaload.training_setup(packed, [*_rows(2), {"input_ids": []}, *_rows(2)])
    assert s.train_dataset.summary.skipped_empty == 1


def test_a_datasets_dataset_is_checked_like_a_list(packed: Plan) -> None:
    datasets = pytest.importorskip("datasets")
    rows = _rows(6)
    good = datasets.Dataset.from_list(rows)
    a = cudaload.training_setup(packed, good, seed=2).train_dataset
    b = cudaload.training_setup(packed, rows, seed=2).train_dataset
    assert list(a) == list(b)
    floats = datasets.Dataset.from_dict({"input_ids": [[5.0, 6.0], [7.0, 8.0]]})
    _refused(packed, floats, "example 0", "5.0")


def test_a_model_that_is_no_causal_lm_gets_its_ids_checked_and_its_labels_left_alone() -> None:
    cls = plan(
        tiny_config("qwen3"),
        hardware=h200(),
        intent="training",
        seq_len=64,
        model_class="AutoModelForSequenceClassification",
    )
    assert cls.training is not None and not cls.training.causal_lm
    vocab = cls.model.vocab_size
    rows = [{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [8], "labels": 0}]
    assert cudaload.training_setup(cls, rows).train_dataset is rows
    _refused(cls, [*rows, {"input_ids": [5, vocab], "labels": 1}], "example 2", f"token id {vocab}")
    _refused(cls, [{"input_ids": [5.0], "labels": 1}], "example 0", "float")
    _refused(cls, {"input_ids": [[5, 6]], "labels": [1]}, "dict of columns")
    # a stream is not read ahead of the trainer
    check_ids(iter([{"input_ids": [-5]}]), vocab)


def test_a_datasets_column_is_checked_by_arrow_and_a_failing_row_named() -> None:
    datasets = pytest.importorskip("datasets")
    vocab = 1000
    rows = [{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [8], "labels": 0}]
    ds = datasets.Dataset.from_list([*rows, {"input_ids": [5, vocab + 3], "labels": 1}])
    with pytest.raises(ConfigurationError, match="example 2"):
        check_ids(ds, vocab)
    # select() keeps the bad row out: the Arrow check flags the column, the rows clear it
    check_ids(ds.select([0, 1]), vocab)
    check_ids(datasets.Dataset.from_list(rows), vocab)
    floats = datasets.Dataset.from_dict({"input_ids": [[5, 6], [7.5]]})
    with pytest.raises(ConfigurationError, match="example 0"):
        check_ids(floats, vocab)


# -- training_setup's own keywords --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"truncate": "yes"}, "truncate is True or False, not str"),
        ({"shuffle": 1}, "shuffle is True or False, not int"),
        ({"seed": "abc"}, "the seed is a whole number, not str"),
        ({"seed": 1.5}, "the seed is a whole number, not float"),
        ({"seed": True}, "the seed is a whole number, not bool"),
    ],
)
def test_training_setup_checks_its_keywords(packed: Plan, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        cudaload.training_setup(packed, _rows(3), **kw)
    # checked even without a data set: the arguments alone would take them in silence
    with pytest.raises(ConfigurationError, match=match):
        cudaload.training_setup(packed, **kw)


def test_pack_takes_the_bound_too() -> None:
    with pytest.raises(ConfigurationError, match="outside the model's vocabulary"):
        pack([{"input_ids": [5, 99]}], tokens_per_step=8, sequences_per_step=2, longest=8, vocab_size=99)
    assert len(
        pack([{"input_ids": [5, 98]}], tokens_per_step=8, sequences_per_step=2, longest=8, vocab_size=99)
    )


# -- peft at the boundary ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_model: Any) -> Path:
    return Path(tiny_model("qwen3"))


def _wrap(path: Path, auto: str = "AutoModelForCausalLM", **lora: Any) -> Any:
    import transformers

    from cudaload.execute.adapters import wrap_peft

    kw: dict[str, Any] = {"intent": "lora", "seq_len": 64, "batch_size": 2, "lora": lora or None}
    if auto != "AutoModelForCausalLM":
        kw["model_class"] = auto
    p = plan(str(path), **kw)
    model = getattr(transformers, auto).from_pretrained(path, dtype=torch.float32)
    return wrap_peft(model, p)


LINEARS = "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"


def test_a_target_modules_typo_names_the_models_layers_and_all_linear(tiny: Path) -> None:
    with pytest.raises(ConfigurationError) as e:
        _wrap(tiny, target_modules="all_linear")
    assert "did you mean 'all-linear'" in str(e.value) and LINEARS in str(e.value)
    assert e.value.fix == "pass lora={'target_modules': 'all-linear'} (peft's word for every linear layer)"
    assert "not found in the base model" in e.value.reasons[0]  # peft's own words kept as the reason
    with pytest.raises(ConfigurationError) as e:
        _wrap(tiny, target_modules=["q_prj", "v_prjo"])
    assert "'q_prj' -> 'q_proj'" in str(e.value) and "['q_proj', 'v_proj']" in (e.value.fix or "")
    with pytest.raises(ConfigurationError, match=f"matches no layer of Qwen3ForCausalLM.*{LINEARS}"):
        _wrap(tiny, target_modules="attn\\..*")
    # some names match, others do not: peft adapts the matches without a word; cudaload warns
    with pytest.warns(CudaloadWarning, match="'q_prj' \\(did you mean 'q_proj'\\?\\)"):
        model = _wrap(tiny, target_modules=["q_prj", "v_proj"])
    assert type(model).__name__ == "PeftModelForCausalLM"


def test_names_that_exist_but_adapt_nothing_or_cannot_be_adapted(tiny: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"adapts no layer.*its layers: 0 to 1") as e:
        _wrap(tiny, target_modules=["q_proj"], layers_to_transform=[7])
    assert "layers_to_transform" in (e.value.fix or "")
    with pytest.raises(ConfigurationError, match="adapts no layer"):
        _wrap(tiny, target_modules=["q_proj"], exclude_modules=["q_proj"])
    # a norm: peft's plain ValueError (no class of its own) told apart by its text
    with pytest.raises(ConfigurationError, match=f"LoRA cannot adapt.*{LINEARS}") as e:
        _wrap(tiny, target_modules=["input_layernorm"])
    assert "is not supported" in e.value.reasons[0]


def test_a_task_type_for_another_kind_of_model_is_refused(tiny: Path) -> None:
    with pytest.raises(ConfigurationError) as e:
        _wrap(tiny, task_type="SEQ_CLS")
    assert "Qwen3ForCausalLM is a CAUSAL_LM model" in str(e.value)
    assert "'task_type': 'CAUSAL_LM'" in (e.value.fix or "")
    assert "model_class='AutoModelForSequenceClassification'" in (e.value.fix or "")
    with pytest.raises(ConfigurationError, match="no peft task type") as e:
        _wrap(tiny, task_type="causal_lm")
    assert "'CAUSAL_LM'" in (e.value.fix or "")
    # what fits passes: the plan's own task type, an explicit match, a classifier with its own head
    assert type(_wrap(tiny)).__name__ == "PeftModelForCausalLM"
    assert type(_wrap(tiny, task_type="CAUSAL_LM")).__name__ == "PeftModelForCausalLM"
    cls = _wrap(tiny, "AutoModelForSequenceClassification", task_type="SEQ_CLS")
    assert type(cls).__name__ == "PeftModelForSequenceClassification"
    assert type(_wrap(tiny, task_type="FEATURE_EXTRACTION")).__name__ == "PeftModelForFeatureExtraction"


def test_a_loraconfig_refusal_is_a_configuration_error(tiny: Path) -> None:
    with pytest.raises(ConfigurationError, match="peft's LoraConfig refused") as e:
        _wrap(tiny, layers_pattern="layers")
    assert "layers_pattern" in e.value.reasons[0]


def test_load_model_refuses_the_typo_before_returning_a_model(tiny: Path) -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'all-linear'"):
        cudaload.load_model(
            str(tiny), intent="lora", lora={"target_modules": "all_linear"}, seq_len=64, dtype="float32"
        )
