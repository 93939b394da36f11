"""Running work against task apps and the training backend: smoke, eval, train."""
