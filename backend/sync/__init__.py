"""The server side of the index sync: keyed Merkle trees, chunk placements, shared vectors."""
