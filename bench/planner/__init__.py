"""Planning: which GPU x split x precision to try and the largest micro-batch that fits (`search`), the rows a plan
ranks with the speed look-ups they need (`rows`), the ranking (`ranking`), its text and JSON (`render`) and the
launch spec of its winner (`launch`). Prices and catalogs are `bench.cost`'s."""
