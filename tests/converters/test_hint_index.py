"""hint_index(names, sep)(prefix) finds, for every prefix, the tensors `hinted(prefix, names, sep)` finds by looking
through every name: random names built from hint words, plain words, empty parts and separators, every prefix they
make and a few that match nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from converters.model_contents import NAME_HINTS, hint_index, hinted

WORDS = sorted({hint for hints in NAME_HINTS.values() for hint in hints}) + ["a", "b", "", "layers", "0"]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([".", "/"]).flatmap(
        lambda sep: st.tuples(
            st.just(sep),
            st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(sep.join), max_size=14, unique=True),
        )
    )
)
def test_every_prefix_gets_what_a_search_of_every_name_gets(case):
    separator, names = case
    hints = hint_index(names, separator)
    prefixes = {"", "a", separator, "missing"} | set(names) | {name.rpartition(separator)[0] for name in names}
    for prefix in prefixes:
        assert hints(prefix) == hinted(prefix, names, separator), prefix


def test_a_decoder_s_norms_find_their_own_weights():
    names = [f"model.layers.{i}.{part}" for i in range(3) for part in ("norm.weight", "mix.weight", "mix.bias")] + [
        "model.norm.weight"
    ]
    hints = hint_index(names, ".")
    assert hints("model.layers.1.norm") == {"scale": "model.layers.1.norm.weight"}
    assert hints("model.norm") == {"scale": "model.norm.weight"}
    assert hints("model.layers.1.mix") == {"scale": "model.layers.1.mix.weight", "bias": "model.layers.1.mix.bias"}
    assert hints("model.layers") == {}
