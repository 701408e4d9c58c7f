"""The Hub search panel: its layout and wiring (`panel`) and its events (`events`)."""
