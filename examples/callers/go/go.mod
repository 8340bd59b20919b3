module idem.example/callers

go 1.19
