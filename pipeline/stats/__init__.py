"""Statistics the decision rests on: group bootstrap, power, paired comparisons, aggregates."""
