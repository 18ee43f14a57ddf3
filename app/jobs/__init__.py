"""Job lifecycle: submit, guarded state transitions, the one execute path."""
