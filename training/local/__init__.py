"""What only `uerl local` uses: its topology loading, raylets, mock games, process
bookkeeping and the endpoints object describing them."""
