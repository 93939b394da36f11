"""The write path: sessions committed in groups, by a thread of the process or by a writer
child process a served app drives from its event loop."""
