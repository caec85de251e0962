"""What a cell trains: the one step, the models, the optimizers."""
