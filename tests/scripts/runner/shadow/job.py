MARK = "the script's own job module"
