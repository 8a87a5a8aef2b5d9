"""transformWithState and transformWithStateInPandas."""
