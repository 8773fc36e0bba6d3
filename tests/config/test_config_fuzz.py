"""Any override a user can type gives a Config or one UserError line, never a traceback."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.config import Config, all_keys, load_config
from rlvr.errors import UserError

VALUES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "-1",
            "0",
            "1e309",
            "nan",
            "inf",
            "-inf",
            "null",
            "[]",
            "{}",
            "[1, 2]",
            "{a: 1}",
            "true",
            "1.5",
            "99999999999999999999",
            "'x'",
            "[[[]]]",
            "{a: {b: c}}",
            "\x00",
            ": :",
            "- a",
        ]
    ),
)
KEYS = st.one_of(st.sampled_from(all_keys()), st.text(max_size=20))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=3))
def test_overrides_give_a_config_or_one_user_error(pairs):
    try:
        cfg = load_config(None, [f"{k}={v}" for k, v in pairs])
    except UserError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))
    else:
        assert isinstance(cfg, Config)
