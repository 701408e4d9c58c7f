"""One adapter slot: its layout (`panel`), its events (`events`) and its "Advanced strength" section."""
