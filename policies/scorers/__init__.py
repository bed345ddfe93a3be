"""Built-in scorers: each rates all candidates in 0..1 (1 best)."""
