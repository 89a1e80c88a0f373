"""`llamadecide plan`: which model on which instance handles a task at a precision for the least money."""
