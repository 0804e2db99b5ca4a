"""``tokenizer.isolated_chars``: a text grid's cells stay one token each, whatever BPE learned."""

from agentrl.models.tokenizer import train_tokenizer

GRIDS = ["######\n#P___#\n#__X_#\n#O_###\n######", "######\n#√S__#\n#_X__#\n#O__P#\n######"] * 50


def test_isolated_characters_are_never_merged_and_text_round_trips():
    merged = train_tokenizer(GRIDS, vocab_size=300)
    assert any(len(t) > 1 and set(t) <= set("#_") for t in merged.tokenize(GRIDS[0]))   # BPE merges "___#" runs
    cells = train_tokenizer(GRIDS, vocab_size=300, isolated_chars="#_OX√PS")
    row_tokens = [cells.tokenize(row) for grid in GRIDS[:2] for row in grid.split("\n")]
    assert all(len(tokens) == 6 for tokens in row_tokens)      # one token per column, "√" (2 bytes) too
    text = "#√S__ push up"
    assert cells.decode(cells(text)["input_ids"]) == text
