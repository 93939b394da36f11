"""The read path over a `TraceStore`: browsing pages of sessions, reward summaries, SFT
export and replays."""
