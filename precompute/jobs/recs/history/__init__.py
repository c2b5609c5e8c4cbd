"""Users' interactions as the recommendation jobs read them: rows checked against the contract,
files validated once, histories grouped by user and kept between nights."""
