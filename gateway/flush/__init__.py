"""Write-back: the flush engine that drains acknowledged writes to the upstream bucket."""
