MARK = "the script's own protocol module"
