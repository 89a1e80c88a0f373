"""People in the loop: the label store, the review queue with its random audit, the audited
precision of automatic decisions, labels from Amazon A2I, and the stream simulation."""
