"""`uerl supervise`: one stored run kept training across a lost Ray head or learner."""
