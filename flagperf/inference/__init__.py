"""The inference family: FlagPerf's seven steps and four toggles, engine plug-ins, timing, LoadGen.

See pipeline.py for the steps and the case contract."""
