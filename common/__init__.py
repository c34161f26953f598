"""What every package may import: the rules that must be the same everywhere.

The lowest layer: it imports no other package of the project. `common.paths` says where tabloop
keeps its files, `common.languages` which language a file is in and how it writes comments.
"""
