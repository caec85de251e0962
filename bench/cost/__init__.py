"""Dollars: the instance catalog, the price of a run, and the ranked plan."""
