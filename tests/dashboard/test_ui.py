"""Page furniture (ui.py) that needs no Streamlit session."""

from __future__ import annotations

from runwatch.dashboard import ui


def test_updated_clock_is_not_read_as_an_emoji_shortcode() -> None:
    text = ui.clock_text(0.0)
    plain = text.replace("\\", "")
    assert ui.EMOJI_SHORTCODE.search(plain), "HH:MM:SS unescaped holds a shortcode (':MM:')"
    assert not ui.EMOJI_SHORTCODE.search(text)
    assert plain.startswith("updated ") and plain.count(":") == 2
