"""bench: gradient accumulation vs large batch, measured.

Data flows one way: spec -> cells -> runner -> rows -> (report | cost).
"""
