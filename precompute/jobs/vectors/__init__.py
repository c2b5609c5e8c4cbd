"""A vector version before its publish: loaded (a copy of the published one with the rows that
moved, or whole) and checked (count, canaries, recall@10 against exact search), its search
parameters tuned to the output's min_recall."""
