"""The Generate tab: request controls (`tab`), jobs with progress and Cancel (`events`), step previews, the
predicted time and load settings."""
