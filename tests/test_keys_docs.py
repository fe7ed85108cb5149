"""The keys page documents every key constant, with the same value."""

from pathlib import Path

from rlkit import keys

DOC = (Path(__file__).resolve().parents[1] / "docs" / "keys.md").read_text()


def test_every_key_constant_is_documented_with_its_value():
    constants = {
        name: value
        for name, value in vars(keys).items()
        if name.isupper()
        and not name.startswith("_")
        and not name.endswith("_NAME")
        and name not in ("NEXT",)
        and isinstance(value, str | tuple)  # keys, not tables such as TORCHRL_KEY_ALIASES
    }
    assert len(constants) >= 15
    for name, value in constants.items():
        assert f"`{name}`" in DOC, name
        parts = [value] if isinstance(value, str) else list(value)
        shown = ", ".join(f'"{v}"' for v in parts)
        shown = shown if isinstance(value, str) else f"({shown})"
        assert shown in DOC, (name, shown)
