"""Does generated music copy its training set, and does it follow its condition?"""
