"""Every user's top k: exact blocked scoring, or candidates from inverted lists over the item
matrix, kept across nights with their recall check; and the user's own items merged back in
where repeats are allowed."""
